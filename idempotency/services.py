"""Housekeeping of key records: expiry and keys stuck in processing."""

import logging
import time
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from .models import IdempotencyRecord

logger = logging.getLogger(__name__)


def record_purge_expired(*, batch_size: int = 1000, max_seconds: float = 30.0) -> int:
    """Delete expired key records in small batches; return how many went.

    Each batch is its own short transaction that deletes rows picked by primary key, so
    the purge never holds many locks at once or long, and writers are never starved.
    It stops after `max_seconds`; the next run carries on.
    """
    deleted = 0
    deadline = time.monotonic() + max_seconds
    while time.monotonic() < deadline:
        now = timezone.now()
        with transaction.atomic():
            ids = list(
                IdempotencyRecord.objects.filter(expires_at__lte=now)
                .order_by("pk")
                .values_list("pk", flat=True)[:batch_size]
            )
            if not ids:
                break
            # Re-check expiry: a row may have been taken over or renewed meanwhile.
            count, _ = IdempotencyRecord.objects.filter(
                pk__in=ids, expires_at__lte=now
            ).delete()
        deleted += count
        if len(ids) < batch_size:
            break
    return deleted


def record_release_stuck(*, grace_seconds: int = 60) -> int:
    """Release keys stuck in processing long after their lease passed.

    A record still at its first recovery point ("started") has committed nothing but
    itself, so deleting it is safe: the client's retry simply runs afresh. A record past
    a recovery point has effects on record; we end its lease so the client's retry (or
    the owning app's re-drive task) resumes it at once, and log it for operators.
    """
    cutoff = timezone.now() - timedelta(seconds=grace_seconds)
    stuck = IdempotencyRecord.objects.filter(
        status=IdempotencyRecord.Status.PROCESSING, locked_until__lt=cutoff
    )
    released, _ = stuck.filter(recovery_point="started").delete()
    for record in stuck.exclude(recovery_point="started"):
        logger.warning(
            "idempotency key stuck after %s: %s %s (endpoint %s)",
            record.recovery_point,
            record.scope,
            record.pk,
            record.endpoint,
        )
    return released
