"""Settings for a real gunicorn server that tests start, kill and restart."""

from ledger.settings.test import *  # noqa: F403

ROOT_URLCONF = "tests.idempotency.urls"
