"""Record storage: the database's memory of each (scope, key), and its locks.

The engine (`idempotency.engine`) tells the story of a request; this module keeps its
promises in SQL. One `IdempotencyRecord` per (scope, key), unique: a finished one holds
the stored response, a `processing` one (phased mode) a lease (`locked_until`) and the
last recovery point. On PostgreSQL every request that executes also holds the key's
advisory lock, so the database decides who runs whatever Redis does: atomic mode holds
it for its whole transaction (taken in the statement that looks the key up), phased
mode while it commits its `processing` record (which then stands for the lock).
SQLite has no advisory locks: an atomic request takes its key's lock in
`idempotency.keylocks` instead, before its transaction begins (`outside_lock`).

Every time here is the database's clock (`sql.DatabaseNow`), put into the statements
that run anyway: a lease's start and end, the take-over's "has it passed?", a record's
time to live. Hosts' clocks disagree; a host whose clock runs fast must not take over
a live lease early, nor one that runs slow keep a dead one.
"""

import hashlib
import json
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from functools import cache
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from . import keylocks
from .models import IdempotencyRecord
from .responses import StoredResponse
from .sql import DatabaseNow, insert_unless_exists

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
    # Fingerprints the same request was stored under by an earlier version
    # (`fingerprint.legacy_fingerprints`).
    aliases: tuple[str, ...] = ()

    def matches(self, fingerprint: str) -> bool:
        """Is `fingerprint`, a stored request's, this request's?"""
        return fingerprint == self.fingerprint or fingerprint in self.aliases


def lease() -> timedelta:
    return timedelta(seconds=settings.IDEMPOTENCY_LEASE_SECONDS)


def ttl() -> timedelta:
    """A record is remembered for the time to live after its request finished."""
    return timedelta(seconds=settings.IDEMPOTENCY_TTL_SECONDS)


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


def lock_and_find(
    call: Call, cursor: CursorWrapper
) -> tuple[bool, IdempotencyRecord | None]:
    """Take the key's advisory lock and look its record up, in one statement (on
    `cursor`, the transaction's: see `insert_finished`).

    (False, None) when another transaction holds the lock: a request with this key
    is running (or storing its answer) right now. The lock is tried, not waited for:
    the contract answers such a request with 409 at once, and a statement that waited
    would still read with the snapshot it took before the wait, blind to the record
    the holder committed meanwhile.
    """
    if not _locks():
        return True, find(call)
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


def _lock_file() -> str | None:
    return keylocks.lock_file(str(connection.settings_dict["NAME"]))


def outside_lock(call: Call) -> AbstractContextManager[bool]:
    """On SQLite, hold the key's lock (`keylocks`) for the block if nobody holds it,
    and yield whether it was free: taken before the transaction begins, as its
    `BEGIN IMMEDIATE` would wait for the key's holder to commit. Elsewhere yield
    True: the advisory lock is taken inside the transaction (`lock_and_find`)."""
    if connection.vendor != "sqlite":
        return nullcontext(True)
    return keylocks.held(_lock_file(), call.scope, call.key)


def wait_for_lock(call: Call, seconds: float) -> None:
    """Wait, at most `seconds`, until no transaction holds the key's advisory lock
    (a request with the key in atomic mode has committed or rolled back)."""
    if seconds <= 0:
        return
    if connection.vendor == "sqlite":
        keylocks.wait_until_free(_lock_file(), call.scope, call.key, seconds)
        return
    if not _locks():
        return
    with transaction.atomic(), connection.cursor() as cursor:
        # At least 1 ms: PostgreSQL reads a lock_timeout of 0 as no timeout at all,
        # and a waiter with under a millisecond left would wait for as long as the
        # key's holder runs.
        timeout = f"{max(1, int(seconds * 1000))}ms"
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
    """The record, unless it has expired (then it is forgotten now). It carries
    `db_now`, the database's clock as the statement read it."""
    records = IdempotencyRecord.objects.filter(pk=record_id).annotate(
        db_now=DatabaseNow()
    )
    if for_update:
        records = records.select_for_update()
    record = records.first()
    if record is not None and record.expired(record.db_now):  # type: ignore[attr-defined]
        record.delete()
        return None
    return record


def _new(call: Call, **values: Any) -> IdempotencyRecord:
    return IdempotencyRecord(
        scope=call.scope,
        key=call.key,
        endpoint=call.endpoint,
        method=call.method,
        path=call.path,
        fingerprint=call.fingerprint,
        request_fields=call.fields,
        **values,
    )


def _insert(record: IdempotencyRecord) -> bool:
    """True if the record is ours; False if the key has one already (we lost).
    Its times are the database's: created now, remembered for the time to live, and
    (a `processing` record) leased for the lease."""
    clock = {"created_at": timedelta(0), "expires_at": ttl()}
    if record.status == Status.PROCESSING:
        clock["locked_until"] = lease()
    return insert_unless_exists(record, ("scope", "key"), clock=clock)


def _finished_status(stored: StoredResponse) -> str:
    return Status.SUCCEEDED if stored.status < 400 else Status.FAILED


def _finished(call: Call, stored: StoredResponse) -> IdempotencyRecord:
    return _new(
        call,
        status=_finished_status(stored),
        response_status=stored.status,
        response_headers=stored.headers,
        response_body=stored.body,
        recovery_point="finished",
    )


def insert_finished(call: Call, stored: StoredResponse, cursor: CursorWrapper) -> bool:
    """Record the key as finished with `stored`, in the caller's transaction; False
    if the key has a record already.

    Every first execution makes this INSERT, so on PostgreSQL it is one statement
    built once, with only what varies passed in: preparing fifteen values through
    the model's fields would cost about as much CPU as the round trip itself. It
    runs on `cursor`, the one `lock_and_find` ran on: a cursor of its own would cost
    a tenth of the statement again.
    """
    if not _locks():
        return _insert(_finished(call, stored))
    values: list[Any] = [
        call.scope,
        call.key,
        call.endpoint,
        call.method,
        call.path,
        call.fingerprint,
        json.dumps(call.fields),
        _finished_status(stored),
        stored.status,
        json.dumps(stored.headers),
        stored.body,
    ]
    cursor.execute(_finished_insert(settings.IDEMPOTENCY_TTL_SECONDS), values)
    return cursor.fetchone() is not None


@cache
def _finished_insert(ttl_seconds: int) -> str:
    """`_finished`'s record, inserted unless the key has one (see `insert_finished`):
    created now and remembered for `ttl_seconds`, both by the database's clock."""
    quote = connection.ops.quote_name
    table = quote(IdempotencyRecord._meta.db_table)
    columns = ", ".join(
        quote(name)  # (each field's column is its name)
        for name in (
            "scope", "key", "endpoint", "method", "path", "fingerprint",
            "request_fields", "status", "response_status", "response_headers",
            "response_body", "recovery_point", "recovery_data", "created_at",
            "expires_at",
        )
    )  # fmt: skip
    return (
        f"INSERT INTO {table} ({columns}) "  # noqa: S608
        "VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s::jsonb, %s, "
        "'finished', '{}'::jsonb, CLOCK_TIMESTAMP(), "
        f"CLOCK_TIMESTAMP() + interval '{int(ttl_seconds)} seconds') "
        f"ON CONFLICT ({quote('scope')}, {quote('key')}) DO NOTHING RETURNING id"
    )


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
    never starts while an atomic one with the key runs. Whether a lease has passed
    is the database's clock's to say (`db_now`, read by the lookup that locks the
    record), never this host's.
    """
    with transaction.atomic():
        if not try_lock(call):
            return Claim(Claimed.BUSY)
        record = _new(call, status=Status.PROCESSING)
        if _insert(record):
            return Claim(Claimed.NEW, record, record.locked_until)
        held = find(call, for_update=True)
        if held is None:  # expired and forgotten just now: start afresh
            if not _insert(record):  # ...unless a third request just did
                return Claim(Claimed.BUSY)
            return Claim(Claimed.NEW, record, record.locked_until)
        if (
            not call.matches(held.fingerprint)
            or held.finished
            or (held.locked_until and held.locked_until > held.db_now)  # type: ignore[attr-defined]
        ):
            return Claim(Claimed.EXISTING, held)
        locked_until = take_over(held)
        if locked_until is None:
            return Claim(Claimed.BUSY)
    return Claim(Claimed.TAKEN_OVER, held, locked_until, held.recovery_data)


def _renew(
    record_id: int,
    locked_until: datetime | None,
    *,
    passed: bool = False,
    recovery: tuple[str, dict[str, Any]] | None = None,
) -> datetime | None:
    """Give the record a new lease (the database's clock plus the lease) if it still
    carries `locked_until` and, with `passed`, if that lease has passed; save the
    recovery point (name, data) with it. The new lease's end, or None if no row
    matched. One statement, `UPDATE ... RETURNING`."""
    quote = connection.ops.quote_name
    adapt = connection.ops.adapt_datetimefield_value
    sets: list[str] = []
    params: list[Any] = []
    if recovery is not None:
        name, data = recovery
        field = IdempotencyRecord._meta.get_field("recovery_data")
        sets += ["recovery_point = %s", "recovery_data = %s"]
        params += [name, field.get_db_prep_save(data, connection)]
    where = "id = %s AND locked_until = %s"
    where_params: list[Any] = [record_id, adapt(locked_until)]
    renewed: datetime | None = None
    if connection.vendor == "postgresql":
        sets.append("locked_until = CLOCK_TIMESTAMP() + %s")
        params.append(lease())
        if passed:
            where += " AND locked_until < CLOCK_TIMESTAMP()"
    else:  # SQLite: this host's clock is the database's
        now = timezone.now()
        renewed = now + lease()
        sets.append("locked_until = %s")
        params.append(adapt(renewed))
        if passed:
            where += " AND locked_until < %s"
            where_params.append(adapt(now))
    table = quote(IdempotencyRecord._meta.db_table)
    sql = (
        f"UPDATE {table} SET {', '.join(sets)} "  # noqa: S608
        f"WHERE {where} RETURNING locked_until"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, *where_params])
        row = cursor.fetchone()
    if row is None:
        return None
    return renewed or row[0]


def take_over(record: IdempotencyRecord) -> datetime | None:
    """The holder's lease has passed (by the database's clock): it died or hangs.
    Take the key over with a conditional update on the lease we saw, so only one of
    several takers wins; the new lease's end, or None if we lost."""
    return _renew(record.pk, record.locked_until, passed=True)


def save_recovery_point(
    record_id: int, locked_until: datetime, name: str, data: dict[str, Any]
) -> datetime | None:
    """Save `name` as the record's recovery point and renew the lease, in the
    caller's transaction; None if the lease we held is gone (taken over)."""
    return _renew(record_id, locked_until, recovery=(name, data))


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
            expires_at=DatabaseNow(plus=ttl()),
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
        ours.update(locked_until=DatabaseNow())
