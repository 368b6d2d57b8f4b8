"""Settings of the beats `test_beat_leader` starts: the test database, the test
broker, periodic tasks every second or two, and a three-second leader lease."""

from tests.worker_settings import *  # noqa: F403

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
