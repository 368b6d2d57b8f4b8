from celery import shared_task

from .services import record_purge_expired, record_release_stuck


@shared_task
def purge_expired_keys() -> int:
    return record_purge_expired()


@shared_task
def release_stuck_keys() -> int:
    return record_release_stuck()
