"""Tasks for tests/ops/test_rabbitmq.py, loaded by its worker (`celery worker -I`)."""

import os
import time
from pathlib import Path

from celery import shared_task


@shared_task(acks_late=True)
def note_arrival(path: str) -> None:
    """Write down when the task ran."""
    Path(path).write_text(str(time.time()))


@shared_task(acks_late=True)
def die_while_flagged(flag: str, done: str) -> None:
    """Kill the worker process running it while `flag` exists (a poison message)."""
    if Path(flag).exists():
        os._exit(1)
    Path(done).write_text("done")
