"""The idempotency engine: the request walk of DESIGN.md, one function per step.

`execute()` is framework-neutral: it takes a described request and a `run` callable that
produces the response, and guarantees that `run` takes effect at most once per
(scope, key). Two modes:

* **atomic** (the default), for work that touches only our database. The effect and the
  finished key record commit in one transaction, so "it happened" and "the key says it
  happened" can never disagree, and a crash leaves nothing behind to recover.
* **phased**, for work that calls outside (the payment provider). The record is
  committed first, in `processing`, with a lease; the work commits in phases, each
  saving a recovery point; a retry after the lease has expired (the first process
  died) takes the key over and continues from the last recovery point.

What is stored, one rule for every endpoint: an outcome decided once the endpoint began
executing (2xx, and 4xx business refusals) is stored and replayed byte for byte. What is
not: a refusal of the request's form (malformed JSON, a body that fails the schema: see
`refuse_form`; 413; 415), 5xx, 429 and our own 409 in-flight answer; after them the key
is free, so a retry (or the corrected request) runs again. (In atomic mode nothing of a
5xx commits; in phased mode the phases that did commit stay, and the retry resumes
after them.)

Exactly once does not rest on Redis: on PostgreSQL the request that executes always
holds the key's advisory lock (atomic mode: for its whole transaction, taken in the
statement that looks the key up; phased mode: while it commits its `processing`
record, which then stands for the lock).
"""

import hashlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any

import redis as redis_lib
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.http import HttpResponse
from django.utils import timezone

from . import fastpath, metrics
from .exceptions import (
    IdempotencyKeyInFlight,
    IdempotencyKeyReused,
    IdempotencyUnavailable,
    LeaseLost,
)
from .fingerprint import changed_fields
from .models import IdempotencyRecord
from .sql import insert_unless_exists

Status = IdempotencyRecord.Status
STORED_HEADERS = ("Content-Type", "Location")
REPLAY_HEADER = "Idempotent-Replayed"


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


@dataclass
class Phases:
    """Handed to a phased view: where the work stands and how to commit the next step.

    ```python
    if idem.recovery_point == "started":
        with idem.phase("payment_created"):
            idem.data["payment_id"] = payment_create(...).pk
    if idem.recovery_point == "payment_created":
        answer = provider.charge(...)          # outside, no transaction, no row locks
        with idem.phase("provider_answered"):
            payment_record_answer(...)
    ```
    """

    record_id: int
    recovery_point: str
    data: dict[str, Any]
    locked_until: datetime
    resumed: bool = False

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Run a block in a transaction that also saves `name` as the recovery point.

        The save is conditional on our lease (`locked_until` unchanged): if another
        request took the key over meanwhile, the whole phase rolls back.
        """
        with transaction.atomic():
            yield
            renewed = timezone.now() + _lease()
            saved = IdempotencyRecord.objects.filter(
                pk=self.record_id, locked_until=self.locked_until
            ).update(recovery_point=name, recovery_data=self.data, locked_until=renewed)
            if not saved:
                raise LeaseLost(f"lost the lease on record {self.record_id}")
        self.recovery_point, self.locked_until = name, renewed


Run = Callable[[Phases | None], HttpResponse]


def _lease() -> timedelta:
    return timedelta(seconds=settings.IDEMPOTENCY_LEASE_SECONDS)


def _expires_at(finished: datetime) -> datetime:
    """A record is remembered for the time to live after its request finished."""
    return finished + timedelta(seconds=settings.IDEMPOTENCY_TTL_SECONDS)


# Set on a response that refuses the request for its form (see `refuse_form`).
FORM_REFUSED = "idempotency_form_refused"
# Statuses that always refuse the request's form: too large, or not our media type.
FORM_STATUSES = frozenset({413, 415})


def refuse_form(response: HttpResponse) -> HttpResponse:
    """Mark `response` as a refusal of the request's form (malformed JSON, a body that
    fails the endpoint's schema): decided before the endpoint began executing, so it
    is not stored and the key stays free for the corrected request."""
    setattr(response, FORM_REFUSED, True)
    return response


def _store(response: HttpResponse) -> bool:
    """Is this response an outcome a retry must see again?

    One rule for every endpoint: what was decided once the endpoint began executing
    (2xx, business 4xx) is stored. A refusal of the request's form is not, nor what a
    retry could change (5xx, 429).
    """
    status = response.status_code
    if status >= 500 or status == 429 or status in FORM_STATUSES:
        return False
    return not getattr(response, FORM_REFUSED, False)


def stored_response(
    fingerprint: str, response: HttpResponse
) -> fastpath.StoredResponse:
    headers = {h: response[h] for h in STORED_HEADERS if response.has_header(h)}
    return fastpath.StoredResponse(
        fingerprint, response.status_code, headers, response.content
    )


def replay(stored: fastpath.StoredResponse) -> HttpResponse:
    metrics.count("replayed")
    response = HttpResponse(stored.body, status=stored.status)
    for name, value in stored.headers.items():
        response[name] = value
    response[REPLAY_HEADER] = "true"
    return response


def _record_stored(record: IdempotencyRecord) -> fastpath.StoredResponse:
    return fastpath.StoredResponse(
        record.fingerprint,
        record.response_status or 200,
        record.response_headers,
        bytes(record.response_body or b""),
    )


def _refuse_reuse(record: IdempotencyRecord, call: Call) -> IdempotencyKeyReused:
    metrics.count("reused")
    if (record.method, record.path) != (call.method, call.path):
        detail = (
            f"This key was first used for {record.method} {record.path}; "
            "use a new key for a new operation."
        )
        return IdempotencyKeyReused(detail, fields=[])
    fields = changed_fields(record.request_fields, call.fields)
    named = ", ".join(fields) if fields else "the body"
    return IdempotencyKeyReused(
        f"This key was first used with a different request ({named} differ); "
        "use a new key for a new operation.",
        fields=fields,
    )


def _lock_id(call: Call) -> int:
    """The key's PostgreSQL advisory lock: 64 bits of a hash of scope and key."""
    digest = hashlib.sha256(f"{call.scope}\x00{call.key}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _locks() -> bool:
    """Whether keys take an advisory lock. SQLite needs none: `BEGIN IMMEDIATE`
    already serialises writers."""
    return connection.vendor == "postgresql"


def _new_record(call: Call, **values: Any) -> IdempotencyRecord:
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
        expires_at=_expires_at(now),
        **values,
    )


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


def _insert(record: IdempotencyRecord) -> bool:
    """True if the record is ours; False if the key has one already (we lost)."""
    return insert_unless_exists(record, ("scope", "key"))


def _try_lock(call: Call) -> bool:
    """Take the key's advisory lock until the transaction ends, if nobody holds it."""
    if not _locks():
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_lock_id(call)])
        return bool(cursor.fetchone()[0])


def _lock_and_find(call: Call) -> tuple[bool, IdempotencyRecord | None]:
    """Take the key's advisory lock and look its record up, in one statement.

    (False, None) when another transaction holds the lock: a request with this key
    is running (or storing its answer) right now. The lock is tried, not waited for:
    the contract answers such a request with 409 at once, and a statement that waited
    would still read with the snapshot it took before the wait, blind to the record
    the holder committed meanwhile.
    """
    if not _locks():
        return True, _existing(call)
    with connection.cursor() as cursor:
        sql = _lookup(connection.vendor, lock=True)
        cursor.execute(sql, [_lock_id(call), call.scope, call.key])
        locked, record_id = cursor.fetchone()
    if not locked:
        return False, None
    return True, None if record_id is None else _load(record_id)


def _existing(call: Call, *, for_update: bool = False) -> IdempotencyRecord | None:
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


def _forget_expired(call: Call) -> bool:
    """Delete the key's record if it has expired; True if one went."""
    deleted, _ = (
        IdempotencyRecord.objects.filter(scope=call.scope, key=call.key)
        .expired()
        .delete()
    )
    return deleted > 0


def _answer_existing(record: IdempotencyRecord, call: Call) -> HttpResponse:
    """Check 2, on the record: another request → 422; finished → replay; else 409."""
    if record.fingerprint != call.fingerprint:
        raise _refuse_reuse(record, call)
    if record.finished:
        return replay(_record_stored(record))
    metrics.count("in_flight")
    raise IdempotencyKeyInFlight()


def _answer_winner(call: Call) -> HttpResponse:
    """We lost the race for the key: answer with the winner's record. If it is gone
    again already (it expired in between), the client's retry will run afresh."""
    record = _existing(call)
    if record is None:
        metrics.count("in_flight")
        raise IdempotencyKeyInFlight()
    return _answer_existing(record, call)


def _begin(call: Call) -> fastpath.FastPath:
    """The fast path's begin; on a Redis error, the fallback or the refusal."""
    try:
        return fastpath.begin(
            call.scope, call.key, settings.IDEMPOTENCY_LEASE_SECONDS * 1000
        )
    except redis_lib.RedisError:
        if settings.IDEMPOTENCY_REDIS_FAILURE == "refuse":
            metrics.count("refused")
            raise IdempotencyUnavailable() from None
        metrics.count("fallback")
        return fastpath.FastPath(available=False)


class _Discard(Exception):
    """Roll the transaction back; the response is returned, maybe stored afterwards."""

    def __init__(self, response: HttpResponse) -> None:
        self.response = response


def execute(
    call: Call,
    run: Run,
    *,
    phased: bool = False,
    taken: fastpath.FastPath | None = None,
) -> HttpResponse:
    """Let `run` take effect at most once per scope and key (see the module doc).

    `taken` is a Redis lock the caller already holds for this request (the replay
    middleware takes it in the same round trip as its cache lookup); the engine then
    finishes with it instead of making its own begin.
    """
    started = time.perf_counter()
    if taken is not None and taken.locked and taken.belongs_to(call.scope, call.key):
        fast = taken
    else:
        fast = _begin(call)
    if fast.cached is not None and fast.cached.fingerprint == call.fingerprint:
        return replay(fast.cached)  # check 1: answered without the database
    if fast.busy:
        metrics.count("in_flight")
        raise IdempotencyKeyInFlight()

    stored: fastpath.StoredResponse | None = None
    try:
        if phased:
            response, stored = _execute_phased(call, run, fast, started)
        else:
            response, stored = _execute_atomic(call, run, fast, started)
        return response
    finally:
        cache_seconds = min(
            settings.IDEMPOTENCY_REPLAY_CACHE_SECONDS, settings.IDEMPOTENCY_TTL_SECONDS
        )
        fastpath.finish(
            fast,
            stored,
            cache_seconds * 1000,
            scope=call.scope,
            credential=call.credential,
        )


def _execute_atomic(
    call: Call, run: Run, fast: fastpath.FastPath, started: float
) -> tuple[HttpResponse, fastpath.StoredResponse | None]:
    # Whatever Redis said, the key's advisory lock decides: a Redis lock can expire or
    # vanish while its holder still runs, and the record is written only at the end.
    held = False
    try:
        with transaction.atomic():
            locked, record = _lock_and_find(call)
            if not locked:
                metrics.count("in_flight")
                raise IdempotencyKeyInFlight()
            metrics.lock_wait.observe(time.perf_counter() - started)
            if record is not None:
                return _answer_existing(record, call), None
            response = run(None)
            if response.status_code >= 400:
                # Undo whatever the view did; store the refusal afterwards, still
                # holding the key if it is to be stored.
                held = _store(response) and _hold(call)
                raise _Discard(response)
            stored = stored_response(call.fingerprint, response)
            if not _insert(_finished_record(call, stored)):
                # A duplicate that got past the lock (it read before we committed)
                # finished first: our effect rolls back and we replay the winner's.
                raise _LostRace
    except _Discard as discarded:
        try:
            return _store_refusal(call, discarded.response)
        finally:
            if held:
                _unhold(call)
    except _LostRace:
        return _answer_winner(call), None
    metrics.count("executed")
    return response, stored


def _hold(call: Call) -> bool:
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


def _unhold(call: Call) -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [_lock_id(call)])
    except DatabaseError:
        # A persistent connection must not keep the key locked: the server frees a
        # closed session's locks.
        connection.close()


class _LostRace(Exception):
    pass


def _finished_record(call: Call, stored: fastpath.StoredResponse) -> IdempotencyRecord:
    return _new_record(
        call,
        status=Status.SUCCEEDED if stored.status < 400 else Status.FAILED,
        response_status=stored.status,
        response_headers=stored.headers,
        response_body=stored.body,
        recovery_point="finished",
    )


def _store_refusal(
    call: Call, response: HttpResponse
) -> tuple[HttpResponse, fastpath.StoredResponse | None]:
    """Store a 4xx business refusal in a transaction of its own; release on 5xx/429."""
    if not _store(response):
        metrics.count("released")
        return response, None
    stored = stored_response(call.fingerprint, response)
    record = _finished_record(call, stored)
    with transaction.atomic():
        inserted = _insert(record)
        if not inserted and _forget_expired(call):
            # An expired record: the view's transaction had forgotten it, and its
            # rollback brought it back.
            inserted = _insert(record)
    if not inserted:
        return _answer_winner(call), None
    metrics.count("executed")
    return response, stored


def _claim(call: Call, started: float) -> Phases | HttpResponse:
    """Commit a `processing` record with a lease, or take over an expired one."""
    now = timezone.now()
    locked_until = now + _lease()
    with transaction.atomic():
        if not _try_lock(call):  # an atomic request with this key is running
            metrics.count("in_flight")
            raise IdempotencyKeyInFlight()
        record = _new_record(call, status=Status.PROCESSING, locked_until=locked_until)
        if _insert(record):
            metrics.lock_wait.observe(time.perf_counter() - started)
            return Phases(record.pk, record.recovery_point, {}, locked_until)
        held = _existing(call, for_update=True)
        if held is None:  # expired and forgotten just now: start afresh
            if not _insert(record):  # ...unless a third request just did
                metrics.count("in_flight")
                raise IdempotencyKeyInFlight()
            return Phases(record.pk, record.recovery_point, {}, locked_until)
        record = held
        if (
            record.fingerprint != call.fingerprint
            or record.finished
            or (record.locked_until and record.locked_until > now)
        ):
            return _answer_existing(record, call)
        # The holder's lease has passed: it died or hangs. Take the key over with a
        # conditional update on the lease we saw, so only one retry wins.
        taken = IdempotencyRecord.objects.filter(
            pk=record.pk, locked_until=record.locked_until
        ).update(locked_until=locked_until)
        if not taken:
            metrics.count("in_flight")
            raise IdempotencyKeyInFlight()
    metrics.count("taken_over")
    metrics.lock_wait.observe(time.perf_counter() - started)
    return Phases(
        record.pk,
        record.recovery_point,
        record.recovery_data,
        locked_until,
        resumed=True,
    )


def _execute_phased(
    call: Call, run: Run, fast: fastpath.FastPath, started: float
) -> tuple[HttpResponse, fastpath.StoredResponse | None]:
    claimed = _claim(call, started)
    if isinstance(claimed, HttpResponse):
        return claimed, None
    phases = claimed
    try:
        response = run(phases)
    except LeaseLost:
        metrics.count("in_flight")
        raise IdempotencyKeyInFlight() from None
    except BaseException:
        _release_lease(phases)
        raise
    if not _store(response):
        _release_lease(phases)
        metrics.count("released")
        return response, None
    stored = stored_response(call.fingerprint, response)
    finished = IdempotencyRecord.objects.filter(
        pk=phases.record_id, locked_until=phases.locked_until
    ).update(
        status=Status.SUCCEEDED if stored.status < 400 else Status.FAILED,
        response_status=stored.status,
        response_headers=stored.headers,
        response_body=stored.body,
        recovery_point="finished",
        locked_until=None,
        expires_at=_expires_at(timezone.now()),
    )
    if not finished:
        metrics.count("in_flight")
        raise IdempotencyKeyInFlight()
    metrics.count("executed")
    return response, stored


def _release_lease(phases: Phases) -> None:
    """Free the key for a retry at once. A record that has committed nothing but
    itself (still "started") is deleted: the key is free for any request, a corrected
    one included. Past a recovery point, the record is the memory of what committed:
    its lease ends now, so a retry with the same request resumes from there."""
    ours = IdempotencyRecord.objects.filter(
        pk=phases.record_id, locked_until=phases.locked_until
    )
    if phases.recovery_point == "started":
        ours.filter(recovery_point="started").delete()
    else:
        ours.update(locked_until=timezone.now())
