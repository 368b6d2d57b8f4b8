"""gunicorn settings of `make run` and compose: `--config python:ledger.gunicorn`."""

import os
from typing import Any

accesslog = "-"
timeout = 60
# SIGTERM lets requests in flight finish for this long before workers are killed.
graceful_timeout = 30


def child_exit(server: Any, worker: Any) -> None:
    """A worker that exited leaves its counters to the sum but no live gauges."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        from ledger import metrics_process_id

        multiprocess.mark_process_dead(metrics_process_id(worker.pid))
