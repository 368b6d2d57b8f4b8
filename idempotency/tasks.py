from celery import shared_task

from .completer import complete_stuck
from .services import record_purge_expired, record_release_stuck


@shared_task
def purge_expired_keys(max_seconds: float = 60.0) -> int:
    """At most `max_seconds` of deleting (beat sends it every five minutes)."""
    return record_purge_expired(max_seconds=max_seconds)


@shared_task
def release_stuck_keys() -> int:
    return record_release_stuck()


@shared_task
def complete_stuck_keys() -> int:
    """Finish phased requests whose holder died and whose client never came back."""
    return complete_stuck()
