"""Settings of the beats `test_beat_leader` starts: the test database, the test
broker, periodic tasks every second or two, and a three-second leader lease.

Everything about the lease is ten times shorter than in production, the broker's
socket waits too (0.5 s instead of 5 s), so that a publish to a broker that never
answers holds beat as long, measured in leases, as it would in production. A
CELERY_BROKER_URL of RabbitMQ gets the RabbitMQ options production sets, as short."""

from ledger.broker import rabbitmq_transport_options, redis_transport_options
from tests.worker_settings import *  # noqa: F403
from tests.worker_settings import CELERY_BROKER_URL

CELERY_BEAT_SCHEDULE = {
    "every-second": {
        "task": "idempotency.tasks.purge_expired_keys",
        "schedule": 1.0,
    },
    "every-two-seconds": {
        "task": "ledger.tasks.check_invariants",
        "schedule": 2.0,
    },
}
BEAT_LEASE_SECONDS = 3
if CELERY_BROKER_URL.partition(":")[0] in {"amqp", "amqps", "pyamqp"}:
    CELERY_BROKER_TRANSPORT_OPTIONS = rabbitmq_transport_options(socket_timeout=0.5)
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = redis_transport_options(
        visibility_timeout=3600, socket_timeout=0.5
    )
BEAT_PUBLISH_TRY_SECONDS = 4 * 0.5
