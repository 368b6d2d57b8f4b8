"""Settings for benchmark servers: the project with the benchmark's URLs."""

from ledger.settings.base import *  # noqa: F403

ROOT_URLCONF = "bench.urls"
LOGGING = {"version": 1, "disable_existing_loggers": False}
