"""Settings of the processes tests/ops/test_rabbitmq.py starts: the test settings, on
the RabbitMQ vhost the test names in CELERY_BROKER_URL, set up as production sets it
up (ledger/settings/base.py reads the same CELERY_BROKER_URL)."""

from ledger.settings import base
from ledger.settings.test import *  # noqa: F403
from ledger.settings.test import env

CELERY_BROKER_URL = env("CELERY_BROKER_URL")
CELERY_BROKER_TRANSPORT_OPTIONS = base.CELERY_BROKER_TRANSPORT_OPTIONS
