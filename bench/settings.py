"""Settings for benchmark servers: the project, with the key optional on the write
endpoints the benchmarks measure, so that one endpoint can be driven both without
the idempotency layer (no key) and with it (a key); and the contenders' URLs."""

from ledger.settings.base import *  # noqa: F403

ROOT_URLCONF = "bench.urls"
IDEMPOTENCY_ENDPOINTS = {"orders.create": "optional", "orders.pay": "optional"}
LOGGING = {"version": 1, "disable_existing_loggers": False}
