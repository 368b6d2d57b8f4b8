"""The Django project package and the double-entry ledger at its core."""

import os
import socket

from prometheus_client import values

# Metrics of every process of a host land in one folder (PROMETHEUS_MULTIPROC_DIR), one
# file per process, named by host and pid: under compose the web and worker containers
# share the folder, and their pids (counted per container) coincide. Set before any
# metric exists, which is why here, where every process starts.
HOST = socket.gethostname()


def metrics_process_id(pid: int | None = None) -> str:
    return f"{HOST}_{pid or os.getpid()}"


if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    values.ValueClass = values.MultiProcessValue(metrics_process_id)

from .celery import app as celery_app  # noqa: E402 - after the metrics' set-up

__all__ = ("celery_app", "metrics_process_id")
