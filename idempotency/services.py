"""Housekeeping of key records: expiry and keys stuck in processing."""

import logging
from datetime import timedelta

from django.db import transaction

from .exceptions import ProblemError
from .models import STARTED, AuditEntry, IdempotencyRecord
from .sql import DatabaseNow, delete_in_batches

logger = logging.getLogger(__name__)


def record_purge_expired(
    *, batch_size: int = 500, max_seconds: float = 60.0, rest: float = 10.0
) -> int:
    """Delete expired key records in small batches (see `delete_in_batches`); records
    still processing are `record_release_stuck`'s (see `IdempotencyRecord.expired`).

    The key table is the one every idempotent request writes to, so the purge keeps
    out of their way: small batches, each followed by a rest ten times as long (with
    five, writers at full speed lost about a fifth of their pace while it ran; with
    ten, about a tenth, over three runs each), for at most a minute a run."""
    expired = IdempotencyRecord.objects.expired()
    return delete_in_batches(
        expired, batch_size=batch_size, max_seconds=max_seconds, rest=rest
    )


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


class KeyNotForgettable(ProblemError):
    status = 409
    code = "key_not_forgettable"
    title = "This key cannot be forgotten"
    default_detail = (
        "Only a key still before its first recovery point can be forgotten: past it, "
        "or finished, the record is the memory of effects that committed."
    )


def record_forget(
    *, record_id: int, actor_id: int | None, actor_name: str
) -> AuditEntry:
    """Forget a key record still before its first recovery point, and say who did.

    One transaction: a conditional DELETE (`WHERE status = 'processing' AND
    recovery_point = 'started'`) and the audit entry. A second press, or two staff
    members at once, find the row gone (the second DELETE waits for the first's row
    lock, then matches nothing) and raise `KeyNotForgettable`: one deletion, one
    audit entry. A request still running with the key loses its lease with the
    record, so its first phase cannot commit (`save_recovery_point` matches
    nothing) and a retry runs afresh: nothing happens twice.
    """
    with transaction.atomic(savepoint=False):
        record = IdempotencyRecord.objects.filter(pk=record_id).first()
        if record is None or not record.forgettable:
            raise KeyNotForgettable()
        deleted, _ = IdempotencyRecord.objects.filter(
            pk=record_id,
            status=IdempotencyRecord.Status.PROCESSING,
            recovery_point=STARTED,
        ).delete()
        if not deleted:  # forgotten, or moved on, since we read it
            raise KeyNotForgettable()
        entry = AuditEntry.objects.create(
            actor_id=actor_id,
            actor_name=actor_name,
            action=AuditEntry.Action.FORGET,
            scope=record.scope,
            key=record.key,
            endpoint=record.endpoint,
            record={
                "status": record.status,
                "recovery_point": record.recovery_point,
                "method": record.method,
                "path": record.path,
                "created_at": record.created_at.isoformat(),
                "locked_until": record.locked_until.isoformat()
                if record.locked_until
                else None,
            },
        )
        logger.warning(
            "idempotency key forgotten by %s: %s %s (endpoint %s)",
            actor_name,
            record.scope,
            record.key,
            record.endpoint,
        )
    return entry
