"""Settings for benchmark servers: the project, plus a small write endpoint that runs
with the idempotency layer when a key is sent and without it when none is."""

from ledger.settings.base import *  # noqa: F403

ROOT_URLCONF = "bench.urls"
IDEMPOTENCY_ENDPOINTS = {"bench.preorder": "optional"}
LOGGING = {"version": 1, "disable_existing_loggers": False}
