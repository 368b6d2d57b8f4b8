"""A real Celery worker on a Redis broker, started and killed by the test.

The worker runs in its own process group (like `tests.servers.gunicorn`) and is
killed, group and all, when the test ends. `broker()` points this test process's
own Celery producer at the same Redis database, so `delay_on_commit` in code the
test calls in-process reaches the worker, and restores it afterwards.
"""

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from django.db import connection
from kombu import pools

from ledger.celery import app
from ledger.settings.test import TEST_REDIS_URL, per_worker, workers_apart
from tests.servers import ROOT, children, stop

# A Redis database of its own: a worker of another test run on this machine must not
# take this run's tasks (TEST_BROKER_URL gives each concurrent run its own, and each
# pytest-xdist worker of a run takes its own below it).
_NAMED = os.environ.get("TEST_BROKER_URL", "redis://127.0.0.1:6379/11")
workers_apart(TEST_REDIS_URL, _NAMED)  # (no worker's broker another's cache)
BROKER_URL = per_worker(_NAMED)
SETTINGS = "tests.worker_settings"


def process_env(**extra: str) -> dict[str, str]:
    db = connection.settings_dict
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        "DATABASE_URL": (
            f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
        ),
        "CELERY_BROKER_URL": BROKER_URL,
        **extra,
    }


def point_producer_at(url: str) -> None:
    app.conf.broker_url = url
    app.conf.broker_transport_options = {}
    # Forget every cached connection and producer (kombu keeps global pools).
    pools.reset()
    app._pool = None
    app.amqp._producer_pool = None


@contextmanager
def broker() -> Iterator[str]:
    """Send this process's tasks to the Redis broker for the test's duration."""
    redis.Redis.from_url(BROKER_URL).flushdb()
    before = app.conf.broker_url
    point_producer_at(BROKER_URL)
    try:
        yield BROKER_URL
    finally:
        point_producer_at(before)
        redis.Redis.from_url(BROKER_URL).flushdb()


@contextmanager
def celery_worker(tmp_path: Path, **extra: str) -> Iterator[subprocess.Popen]:
    """`celery -A ledger worker`, one prefork child, on the test database."""
    log_path = tmp_path / f"celery-{time.time_ns()}.log"
    log = log_path.open("w")
    process = subprocess.Popen(
        [
            str(ROOT / ".venv/bin/celery"),
            "-A",
            "ledger",
            "worker",
            "--pool=prefork",
            "--concurrency=1",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel=INFO",
        ],
        cwd=ROOT,
        env=process_env(**extra),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while "ready." not in log_path.read_text():
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        process.log_path = log_path  # type: ignore[attr-defined]
        yield process
    finally:
        stop(process)
        log.close()


def pool_child(worker: subprocess.Popen) -> int:
    (child,) = children(worker.pid)
    return child
