from celery import shared_task

from .completer import complete_stuck
from .services import record_purge_expired, record_release_stuck


@shared_task
def purge_expired_keys() -> int:
    return record_purge_expired()


@shared_task
def release_stuck_keys() -> int:
    return record_release_stuck()


@shared_task
def complete_stuck_keys() -> int:
    """Finish phased requests whose holder died and whose client never came back."""
    return complete_stuck()
