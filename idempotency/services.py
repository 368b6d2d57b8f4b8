"""Housekeeping of key records: expiry and keys stuck in processing."""

import logging
from datetime import timedelta

from .models import IdempotencyRecord
from .sql import DatabaseNow, delete_in_batches

logger = logging.getLogger(__name__)


def record_purge_expired(*, batch_size: int = 1000, max_seconds: float = 30.0) -> int:
    """Delete expired key records in small batches (see `delete_in_batches`); records
    still processing are `record_release_stuck`'s (see `IdempotencyRecord.expired`)."""
    expired = IdempotencyRecord.objects.expired()
    return delete_in_batches(expired, batch_size=batch_size, max_seconds=max_seconds)


def record_release_stuck(*, grace_seconds: int = 60) -> int:
    """Release keys stuck in processing long after their lease passed.

    A record still at its first recovery point ("started") has committed nothing but
    itself, so deleting it is safe: the client's retry simply runs afresh. A record past
    a recovery point has effects on record; we end its lease so the client's retry (or
    the owning app's re-drive task) resumes it at once, and log it for operators.
    """
    cutoff = DatabaseNow(plus=-timedelta(seconds=grace_seconds))
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
