"""Settings for the processes of the load and chaos run (`bench/load.py`).

The project's own settings, with beat's re-drives (and the merchant sub-accounts'
sweep) every few seconds instead of every minute so that a one-minute run sees them
work, and a broker visibility timeout short
enough that a task held by a SIGKILLed Celery worker comes back within the run.
Everything else (database, Redis, lease, provider) comes from the environment the
runner sets.
"""

from ledger.settings.base import *  # noqa: F403
from ledger.settings.base import CELERY_BEAT_SCHEDULE

for _name in (
    "idempotency-release-stuck",
    "payments-redrive-pending",
    "payments-redrive-inbox",
    "ledger-sweep-merchant-sub-accounts",
):
    CELERY_BEAT_SCHEDULE[_name] = {**CELERY_BEAT_SCHEDULE[_name], "schedule": 5.0}

# A task a SIGKILLed worker held unacknowledged goes back to the queue once it is
# `visibility_timeout` old; kombu looks for such tasks every `unacked_restore_interval`
# x `unacked_restore_throttle` seconds (100 s by default, longer than the short run).
# A delayed task held past the timeout is handed out twice: every task is idempotent.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": 10,
    "unacked_restore_interval": 2,
    "unacked_restore_throttle": 1,
}
