"""Prometheus metrics of the web app and the Celery tasks, and the task log line.

Read at `/metrics` together with the idempotency counters (`idempotency.metrics`):

- `http_requests_total{method, route, status}` and
  `http_request_duration_seconds{method, route}`: every request, by URL name (never by
  raw path, so ids do not explode the series); `route="unmatched"` for 404s.
- `celery_tasks_total{task, outcome}` (`succeeded`, `failed`, `retried`) and
  `celery_task_duration_seconds{task}`; `celery_publishes_total{task, outcome}`
  (`sent`, `failed`, `skipped`): the tasks web requests sent (`ledger.broker`).
- what the apps read from the database at scrape time (`register_scrape_collector`):
  `payments_callback_inbox_depth`, `payments_provider_events_parked`,
  `payments_provider_events_not_its_charge`, `payments_provider_payments_parked` and
  `payments_provider_answers_not_its_charge` (`payments.metrics`).

With PROMETHEUS_MULTIPROC_DIR set (an empty directory; `make run` sets and empties one
in the data folder) every web worker and every Celery process writes its samples
there and `/metrics` sums them: one figure per host.
"""

import logging
import os
import time
from typing import Any

from celery import signals
from prometheus_client import Counter, Histogram
from prometheus_client.registry import Collector

http_requests = Counter(
    "http_requests",
    "HTTP requests by method, route name and status.",
    ["method", "route", "status"],
)
http_duration = Histogram(
    "http_request_duration_seconds",
    "Time to answer an HTTP request.",
    ["method", "route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
celery_tasks = Counter("celery_tasks", "Celery task outcomes.", ["task", "outcome"])
# Tasks that web requests send (`ledger.broker.publish_within`): `sent`, `failed`
# (the broker did not take it in time) or `skipped` (during the break after a failure).
celery_publishes = Counter(
    "celery_publishes", "Tasks sent from requests, by outcome.", ["task", "outcome"]
)
celery_duration = Histogram(
    "celery_task_duration_seconds",
    "Time a Celery task ran.",
    ["task"],
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120),
)

task_log = logging.getLogger("ledger.tasks")
_started: dict[str, float] = {}


# Collectors that read the database when Prometheus scrapes (not per-process
# samples): each app registers its own (`payments.metrics`), and `/metrics` asks them.
SCRAPE_COLLECTORS: list[Collector] = []


def register_scrape_collector(collector: Collector) -> None:
    SCRAPE_COLLECTORS.append(collector)


def _task_name(sender: Any) -> str:
    return getattr(sender, "name", None) or str(sender)


@signals.worker_process_shutdown.connect
def _pool_process_exited(pid: int | None = None, **_: Any) -> None:
    """A Celery pool process that ends keeps its counters in the sum, like a
    gunicorn worker (ledger.gunicorn.child_exit)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        from ledger import metrics_process_id

        multiprocess.mark_process_dead(metrics_process_id(pid))


@signals.task_prerun.connect
def _task_started(task_id: str, **_: Any) -> None:
    _started[task_id] = time.monotonic()


def _finish(sender: Any, task_id: str | None, outcome: str, **fields: Any) -> None:
    name = _task_name(sender)
    celery_tasks.labels(name, outcome).inc()
    started = _started.pop(task_id or "", None)
    duration = None if started is None else time.monotonic() - started
    if duration is not None:
        celery_duration.labels(name).observe(duration)
    task_log.info(
        "celery_task",
        extra={
            "event": "celery_task",
            "task": name,
            "task_id": task_id,
            "outcome": outcome,
            "duration_ms": None if duration is None else round(duration * 1000, 1),
            **fields,
        },
    )


@signals.task_success.connect
def _task_succeeded(sender: Any = None, **_: Any) -> None:
    _finish(sender, sender.request.id, "succeeded")


@signals.task_failure.connect
def _task_failed(
    sender: Any = None, task_id: str | None = None, exception: Any = None, **_: Any
) -> None:
    _finish(sender, task_id, "failed", error=exception.__class__.__name__)


@signals.task_retry.connect
def _task_retried(sender: Any = None, request: Any = None, **_: Any) -> None:
    _finish(sender, getattr(request, "id", None), "retried")
