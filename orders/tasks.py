from celery import shared_task
from django.conf import settings

from .services import preorder_purge_expired


@shared_task
def purge_expired_preorders() -> int:
    """Delete pre-orders expired unused for PREORDER_PURGE_AFTER_SECONDS."""
    return preorder_purge_expired(grace_seconds=settings.PREORDER_PURGE_AFTER_SECONDS)
