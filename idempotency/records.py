"""Record storage: the database's memory of each (scope, key), and its locks.

The engine (`idempotency.engine`) tells the story of a request; this module keeps its
promises in SQL. One `IdempotencyRecord` per (scope, key), unique: a finished one holds
the stored response, a `processing` one (phased mode) a lease (`locked_until`) and the
last recovery point. On PostgreSQL every request that executes also holds the key's
advisory lock, so the database decides who runs whatever Redis does: atomic mode holds
it for its whole transaction (taken in the statement that looks the key up), phased
mode while it commits its `processing` record (which then stands for the lock).
SQLite needs no lock: `BEGIN IMMEDIATE` already serialises writers.
"""

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from functools import cache
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from .models import IdempotencyRecord
from .responses import StoredResponse
from .sql import insert_unless_exists

Status = IdempotencyRecord.Status


@dataclass(frozen=True)
class Call:
    """One idempotent request, described independently of any web framework."""

    scope: str
    key: str
    endpoint: str
    method: str
    path: str
    fingerprint: str
    fields: dict[str, str]
    # A digest of the caller's credential, so the replay middleware can find `scope`
    # without authenticating; '' when the caller did not use an API token.
    credential: str = ""


def lease() -> timedelta:
    return timedelta(seconds=settings.IDEMPOTENCY_LEASE_SECONDS)


def expires_at(finished: datetime) -> datetime:
    """A record is remembered for the time to live after its request finished."""
    return finished + timedelta(seconds=settings.IDEMPOTENCY_TTL_SECONDS)


def _lock_id(call: Call) -> int:
    """The key's PostgreSQL advisory lock: 64 bits of a hash of scope and key."""
    digest = hashlib.sha256(f"{call.scope}\x00{call.key}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _locks() -> bool:
    return connection.vendor == "postgresql"


@cache
def _lookup(vendor: str, *, lock: bool = False) -> str:
    """The key lookup of the hot path, built once per database vendor.

    With `lock`, the same statement first tries the key's advisory lock (held until
    the transaction ends, released by the server even if this process dies) and
    answers whether it got it: the lock costs no round trip of its own.

    Plain SQL rather than an ORM query: compiling an ORM query costs more CPU than the
    round trip it makes, and this runs on every idempotent request.
    """
    quote = connection.ops.quote_name
    table = quote(IdempotencyRecord._meta.db_table)
    select = f"SELECT id FROM {table} WHERE scope = %s AND {quote('key')} = %s"  # noqa: S608
    if not lock:
        return select
    return f"SELECT pg_try_advisory_xact_lock(%s), ({select})"


def lock_and_find(call: Call) -> tuple[bool, IdempotencyRecord | None]:
    """Take the key's advisory lock and look its record up, in one statement.

    (False, None) when another transaction holds the lock: a request with this key
    is running (or storing its answer) right now. The lock is tried, not waited for:
    the contract answers such a request with 409 at once, and a statement that waited
    would still read with the snapshot it took before the wait, blind to the record
    the holder committed meanwhile.
    """
    if not _locks():
        return True, find(call)
    with connection.cursor() as cursor:
        sql = _lookup(connection.vendor, lock=True)
        cursor.execute(sql, [_lock_id(call), call.scope, call.key])
        locked, record_id = cursor.fetchone()
    if not locked:
        return False, None
    return True, None if record_id is None else _load(record_id)


def try_lock(call: Call) -> bool:
    """Take the key's advisory lock until the transaction ends, if nobody holds it."""
    if not _locks():
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_lock_id(call)])
        return bool(cursor.fetchone()[0])


def wait_for_lock(call: Call, seconds: float) -> None:
    """Wait, at most `seconds`, until no transaction holds the key's advisory lock
    (a request with the key in atomic mode has committed or rolled back)."""
    if not _locks() or seconds <= 0:
        return
    with transaction.atomic(), connection.cursor() as cursor:
        timeout = f"{int(seconds * 1000)}ms"
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [timeout])
        try:
            with transaction.atomic():  # a savepoint: the timeout is expected
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_lock_id(call)])
        except DatabaseError:
            pass  # still held at the deadline


def find(call: Call, *, for_update: bool = False) -> IdempotencyRecord | None:
    """The key's record, if any. A first execution (the common case) costs one
    indexed lookup; the full record is loaded only when there is one."""
    with connection.cursor() as cursor:
        cursor.execute(_lookup(connection.vendor), [call.scope, call.key])
        row = cursor.fetchone()
    if row is None:
        return None
    return _load(row[0], for_update=for_update)


def _load(record_id: int, *, for_update: bool = False) -> IdempotencyRecord | None:
    """The record, unless it has expired (then it is forgotten now)."""
    records = IdempotencyRecord.objects.filter(pk=record_id)
    if for_update:
        records = records.select_for_update()
    record = records.first()
    if record is not None and record.expired(timezone.now()):
        record.delete()
        return None
    return record


def _new(call: Call, **values: Any) -> IdempotencyRecord:
    now = timezone.now()
    return IdempotencyRecord(
        scope=call.scope,
        key=call.key,
        endpoint=call.endpoint,
        method=call.method,
        path=call.path,
        fingerprint=call.fingerprint,
        request_fields=call.fields,
        created_at=now,
        expires_at=expires_at(now),
        **values,
    )


def _insert(record: IdempotencyRecord) -> bool:
    """True if the record is ours; False if the key has one already (we lost)."""
    return insert_unless_exists(record, ("scope", "key"))


def _finished(call: Call, stored: StoredResponse) -> IdempotencyRecord:
    return _new(
        call,
        status=Status.SUCCEEDED if stored.status < 400 else Status.FAILED,
        response_status=stored.status,
        response_headers=stored.headers,
        response_body=stored.body,
        recovery_point="finished",
    )


def insert_finished(call: Call, stored: StoredResponse) -> bool:
    """Record the key as finished with `stored`, in the caller's transaction; False
    if the key has a record already."""
    return _insert(_finished(call, stored))


def store_refusal(call: Call, stored: StoredResponse) -> bool:
    """Record a refusal in a transaction of its own, after the one that ran the view
    rolled back; False if another request's record got there first."""
    record = _finished(call, stored)
    with transaction.atomic():
        if _insert(record):
            return True
        # An expired record: the view's transaction had forgotten it, and its
        # rollback brought it back. Forget it again.
        deleted, _ = (
            IdempotencyRecord.objects.filter(scope=call.scope, key=call.key)
            .expired()
            .delete()
        )
        return bool(deleted) and _insert(record)


def hold(call: Call) -> bool:
    """Keep the key locked past the rollback that undoes a refused request, until the
    refusal is stored: a session-level advisory lock, taken while this transaction
    still holds the key's lock (so it never waits). Refusals only: two statements.
    False if the database refused it (a failed transaction; the key is then free for
    that moment, and the unique constraint still lets one answer win)."""
    if not _locks():
        return False
    rollback = transaction.get_rollback()
    # A domain error marked the transaction for rollback; it can still take a lock.
    transaction.set_rollback(False)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [_lock_id(call)])
    except DatabaseError:
        return False
    finally:
        transaction.set_rollback(rollback)
    return True


def unhold(call: Call) -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [_lock_id(call)])
    except DatabaseError:
        # A persistent connection must not keep the key locked: the server frees a
        # closed session's locks.
        connection.close()


# Phased mode.


class Claimed(Enum):
    NEW = "new"  # a fresh `processing` record is ours
    TAKEN_OVER = "taken_over"  # a dead holder's lease passed; the record is ours now
    EXISTING = "existing"  # the key has a record to answer with (replay, 422, 409)
    BUSY = "busy"  # another request is claiming the key right now


@dataclass
class Claim:
    outcome: Claimed
    record: IdempotencyRecord | None = None
    locked_until: datetime | None = None
    data: dict[str, Any] = field(default_factory=dict)


def claim(call: Call) -> Claim:
    """Commit a `processing` record with a lease, or take over an expired one.

    One transaction that also tries the key's advisory lock, so a phased request
    never starts while an atomic one with the key runs.
    """
    now = timezone.now()
    locked_until = now + lease()
    with transaction.atomic():
        if not try_lock(call):
            return Claim(Claimed.BUSY)
        record = _new(call, status=Status.PROCESSING, locked_until=locked_until)
        if _insert(record):
            return Claim(Claimed.NEW, record, locked_until)
        held = find(call, for_update=True)
        if held is None:  # expired and forgotten just now: start afresh
            if not _insert(record):  # ...unless a third request just did
                return Claim(Claimed.BUSY)
            return Claim(Claimed.NEW, record, locked_until)
        if (
            held.fingerprint != call.fingerprint
            or held.finished
            or (held.locked_until and held.locked_until > now)
        ):
            return Claim(Claimed.EXISTING, held)
        if not take_over(held, locked_until):
            return Claim(Claimed.BUSY)
    return Claim(Claimed.TAKEN_OVER, held, locked_until, held.recovery_data)


def take_over(record: IdempotencyRecord, locked_until: datetime) -> bool:
    """The holder's lease has passed: it died or hangs. Take the key over with a
    conditional update on the lease we saw, so only one of several takers wins."""
    return bool(
        IdempotencyRecord.objects.filter(
            pk=record.pk, locked_until=record.locked_until
        ).update(locked_until=locked_until)
    )


def save_recovery_point(
    record_id: int, locked_until: datetime, name: str, data: dict[str, Any]
) -> datetime | None:
    """Save `name` as the record's recovery point and renew the lease, in the
    caller's transaction; None if the lease we held is gone (taken over)."""
    renewed = timezone.now() + lease()
    saved = IdempotencyRecord.objects.filter(
        pk=record_id, locked_until=locked_until
    ).update(recovery_point=name, recovery_data=data, locked_until=renewed)
    return renewed if saved else None


def finish(record_id: int, locked_until: datetime, stored: StoredResponse) -> bool:
    """Store the response of a phased request and end its lease; False if the lease
    we held is gone."""
    return bool(
        IdempotencyRecord.objects.filter(
            pk=record_id, locked_until=locked_until
        ).update(
            status=Status.SUCCEEDED if stored.status < 400 else Status.FAILED,
            response_status=stored.status,
            response_headers=stored.headers,
            response_body=stored.body,
            recovery_point="finished",
            locked_until=None,
            expires_at=expires_at(timezone.now()),
        )
    )


def release(record_id: int, locked_until: datetime, recovery_point: str) -> None:
    """Free the key for a retry at once. A record that has committed nothing but
    itself (still "started") is deleted: the key is free for any request, a corrected
    one included. Past a recovery point, the record is the memory of what committed:
    its lease ends now, so a retry with the same request resumes from there."""
    ours = IdempotencyRecord.objects.filter(pk=record_id, locked_until=locked_until)
    if recovery_point == "started":
        ours.filter(recovery_point="started").delete()
    else:
        ours.update(locked_until=timezone.now())
