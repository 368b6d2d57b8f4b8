from celery import shared_task

from .completer import complete_stuck
from .management.arguments import MAX_SECONDS
from .services import record_purge_expired, record_release_stuck


@shared_task
def purge_expired_keys(max_seconds: float = 60.0) -> int:
    """At most `max_seconds` of deleting (beat sends it every five minutes).

    Anything but a number of seconds from 0 to `MAX_SECONDS` (an operator's `celery
    call` with a typo) is refused before anything is deleted: NaN would delete
    nothing and say so as if done, infinity would run without end.
    """
    if (
        isinstance(max_seconds, bool)
        or not isinstance(max_seconds, int | float)
        or not 0 <= max_seconds <= MAX_SECONDS
    ):
        raise ValueError(f"max_seconds is 0 to {MAX_SECONDS}, not {max_seconds!r}")
    return record_purge_expired(max_seconds=max_seconds)


@shared_task
def release_stuck_keys() -> int:
    return record_release_stuck()


@shared_task
def complete_stuck_keys() -> int:
    """Finish phased requests whose holder died and whose client never came back."""
    return complete_stuck()
