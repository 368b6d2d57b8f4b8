"""gunicorn settings of `make run` and compose: `--config python:ledger.gunicorn`."""

import gc
import os
from typing import Any

accesslog = "-"
timeout = 60
# SIGTERM lets requests in flight finish for this long before workers are killed.
graceful_timeout = 30
# gunicorn's control socket (`gunicornc`): unused here, and a thread in the master
# that stops and starts again around every fork of a worker; every gunicorn of one
# user on one machine (make run's web and provider) shares its default path.
control_socket_disable = True


def post_worker_init(worker: Any) -> None:
    """The worker has loaded the app: load its URLs too, then hide all of it from the
    garbage collector.

    When Python's collector collects its oldest generation, which the garbage of
    requests triggers now and then, it walks every container object it tracks: in
    a loaded worker, some 135,000 that live as long as the process (modules, models,
    views, serializers, URL patterns), tens of millions of instructions at once.
    `gc.freeze()` moves them out of its sight for good, so a collection walks only
    what requests made (README, "What it costs").

    The URLs are loaded first (`url_patterns` imports every view module) so that
    they are frozen too; a mistake in one of them now stops the worker at start
    instead of failing its first request. What is garbage already is collected
    before the freeze, which would otherwise keep it for the process's life.
    """
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 - imports the URLconf and its views
    gc.collect()
    gc.freeze()


def child_exit(server: Any, worker: Any) -> None:
    """A worker that exited leaves its counters to the sum but no live gauges."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        from ledger import metrics_process_id

        multiprocess.mark_process_dead(metrics_process_id(worker.pid))
