"""Settings for the real gunicorn and Celery worker the payments tests start: the
test database, and the Redis broker the test names in CELERY_BROKER_URL."""

from ledger.settings.test import *  # noqa: F403
from ledger.settings.test import env

CELERY_BROKER_URL = env("CELERY_BROKER_URL", "memory://")
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
