"""Settings for benchmark servers: the project, with the key optional on the write
endpoints the benchmarks measure, so that one endpoint can be driven both without
the idempotency layer (no key) and with it (a key); the contenders' URLs; the
benchmark's own headers (bench/middleware.py); and Celery results, so that the
benchmark can wait for the purge task it sends to a real worker."""

from ledger.settings.base import *  # noqa: F403
from ledger.settings.base import CELERY_BROKER_URL, MIDDLEWARE

ROOT_URLCONF = "bench.urls"
IDEMPOTENCY_ENDPOINTS = {"orders.create": "optional", "orders.pay": "optional"}
LOGGING = {"version": 1, "disable_existing_loggers": False}
MIDDLEWARE = [
    "bench.middleware.ReplayMiddlewareOutsideBench"
    if name == "idempotency.middleware.ReplayMiddleware"
    else name
    for name in MIDDLEWARE
]
MIDDLEWARE.append("bench.middleware.BenchMiddleware")
if CELERY_BROKER_URL.startswith("redis://"):
    CELERY_RESULT_BACKEND = CELERY_BROKER_URL
    CELERY_TASK_IGNORE_RESULT = False
