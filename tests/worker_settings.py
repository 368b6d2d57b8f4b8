"""Settings for the real gunicorn and Celery worker the payments tests start: the
test database, and the Redis broker the test names in CELERY_BROKER_URL."""

from ledger.broker import redis_transport_options
from ledger.settings.test import *  # noqa: F403
from ledger.settings.test import env

CELERY_BROKER_URL = env("CELERY_BROKER_URL", "memory://")
# The production options (bounded socket waits included), with a shorter visibility.
CELERY_BROKER_TRANSPORT_OPTIONS = redis_transport_options(visibility_timeout=3600)
