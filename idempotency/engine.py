"""The idempotency engine: the request walk of DESIGN.md, told as one story.

`execute()` is framework-neutral: it takes a described request (`Call`) and a `run`
callable that produces the response, and guarantees that `run` takes effect at most
once per (scope, key). Two modes:

* **atomic** (the default), for work that touches only our database. The effect and the
  finished key record commit in one transaction, so "it happened" and "the key says it
  happened" can never disagree, and a crash leaves nothing behind to recover.
* **phased**, for work that calls outside (the payment provider). The record is
  committed first, in `processing`, with a lease; the work commits in phases, each
  saving a recovery point; a retry after the lease has expired (the first process
  died), or beat's completer, takes the key over and continues from the last recovery
  point.

The walk, for every request:

1. Redis (optional, `fastpath`): a cached finished response is replayed at once; a
   key another request holds is refused (409) at once; otherwise we hold its lock.
2. The database decides, whatever Redis said (`records`): the key's advisory lock and
   its record. Another request's record → 422; finished → replay; in flight → 409.
3. Run, and record: atomic or phased, below.
4. Store what must be stored (`responses`), release and cache in Redis.

A caller that prefers to wait (`Prefer: wait=N`) for a key in flight gets, instead of
the 409, the first request's stored answer once it finishes (`waiting`).
"""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import redis as redis_lib
from django.conf import settings
from django.db import connection, transaction
from django.http import HttpResponse
from django.utils import timezone

from . import fastpath, metrics, records, waiting
from .exceptions import (
    IdempotencyKeyInFlight,
    IdempotencyKeyReused,
    IdempotencyUnavailable,
    LeaseLost,
)
from .fingerprint import changed_fields
from .models import IdempotencyRecord
from .records import Call, Claimed
from .responses import (
    REPLAY_HEADER,
    StoredResponse,
    refuse_form,
    replay,
    should_store,
)

__all__ = ["REPLAY_HEADER", "Call", "Phases", "execute", "refuse_form", "replay"]

Status = IdempotencyRecord.Status
PREFERENCE_APPLIED = "Preference-Applied"
Outcome = tuple[HttpResponse, StoredResponse | None]


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
            renewed = records.save_recovery_point(
                self.record_id, self.locked_until, name, self.data
            )
            if renewed is None:
                raise LeaseLost(f"lost the lease on record {self.record_id}")
        self.recovery_point, self.locked_until = name, renewed

    @classmethod
    def unrecorded(cls) -> "Phases":
        """Phases with no key record behind them, for a caller that is its own entry
        point (a web view): each phase is a durable transaction of its own, and the
        work, written to be repeated, continues where it stopped when called again."""
        return _Unrecorded(0, "started", {}, timezone.now())


class _Unrecorded(Phases):
    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        with transaction.atomic(durable=True):
            yield
        self.recovery_point = name


Run = Callable[[Phases | None], HttpResponse]


def in_flight() -> IdempotencyKeyInFlight:
    """The refusal of a request whose key another request holds: 409 (counted by
    `execute` when it answers it: a waiter may find the key busy many times and
    still answer a replay)."""
    return IdempotencyKeyInFlight()


def execute(
    call: Call,
    run: Run,
    *,
    phased: bool = False,
    taken: fastpath.FastPath | None = None,
    wait: int = 0,
) -> HttpResponse:
    """Let `run` take effect at most once per scope and key (see the module doc).

    `taken` is a Redis lock the caller already holds for this request (the replay
    middleware takes it in the same round trip as its cache lookup). `wait` is how
    many seconds the caller prefers to wait for a key in flight instead of a 409.
    """
    try:
        return _walk(call, run, phased=phased, taken=taken)
    except IdempotencyKeyInFlight:
        if wait <= 0:
            metrics.count("in_flight")
            raise
    deadline = time.monotonic() + wait
    applied = {PREFERENCE_APPLIED: f"wait={wait}"}
    while True:
        waiting.until_finished(call, deadline - time.monotonic())
        # Now a replay, or a run of our own if the first one freed the key (a 5xx),
        # or, still in flight at the deadline, the 409 after all: each says it
        # waited. In flight before the deadline (another waiter took the freed key
        # over first, or held its lock for a moment): wait again.
        try:
            response = _walk(call, run, phased=phased, taken=None)
        except IdempotencyKeyInFlight as busy:
            if (left := deadline - time.monotonic()) > 0:
                time.sleep(min(waiting.POLL_SECONDS, left))  # never a busy loop
                continue
            busy.headers = {**busy.headers, **applied}
            metrics.count("in_flight")
            raise
        response[PREFERENCE_APPLIED] = applied[PREFERENCE_APPLIED]
        return response


def _walk(
    call: Call, run: Run, *, phased: bool, taken: fastpath.FastPath | None
) -> HttpResponse:
    started = time.perf_counter()
    if taken is not None and taken.locked and taken.belongs_to(call.scope, call.key):
        fast = taken
    else:
        fast = _begin(call)
    if fast.cached is not None and call.matches(fast.cached.fingerprint):
        return replay(fast.cached)  # check 1: answered without the database
    if fast.busy:
        raise in_flight()
    stored: StoredResponse | None = None
    try:
        response, stored = (_phased if phased else _atomic)(call, run, started)
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


def _atomic(call: Call, run: Run, started: float) -> Outcome:
    with records.outside_lock(call) as free:  # SQLite's stand-in for the advisory lock
        if not free:
            raise in_flight()
        return _atomic_transaction(call, run, started)


def _atomic_transaction(call: Call, run: Run, started: float) -> Outcome:
    """Check, run and record the key in one transaction.

    The key's advisory lock, taken in the statement that looks the key up, is held
    until the transaction ends: whatever Redis said, no other request with the key
    runs meanwhile. A refusal (4xx) rolls back whatever the view did and is then
    stored in a transaction of its own, the key still held in between.
    """
    held = won = False
    stored = None
    # One cursor for the transaction's two statements on the key, as each new cursor
    # costs CPU (the view's queries make their own).
    with transaction.atomic(), connection.cursor() as cursor:
        locked, record = records.lock_and_find(call, cursor)
        if not locked:
            raise in_flight()
        metrics.lock_wait.observe(time.perf_counter() - started)
        if record is not None:
            return _answer(record, call), None
        response = run(None)
        refused = response.status_code >= 400
        if refused:
            held = should_store(response) and records.hold(call)
            transaction.set_rollback(True)
        else:
            stored = StoredResponse.of(call.fingerprint, response)
            won = records.insert_finished(call, stored, cursor)
            if not won:
                # A duplicate that got past the lock (it read before we committed)
                # finished first: our effect rolls back and we replay the winner's.
                transaction.set_rollback(True)
    if refused:
        try:
            return _store_refusal(call, response)
        finally:
            if held:
                records.unhold(call)
    if not won:
        return _answer_winner(call), None
    metrics.count("executed")
    return response, stored


def _store_refusal(call: Call, response: HttpResponse) -> Outcome:
    if not should_store(response):
        metrics.count("released")
        return response, None
    stored = StoredResponse.of(call.fingerprint, response)
    if not records.store_refusal(call, stored):
        return _answer_winner(call), None
    metrics.count("executed")
    return response, stored


def _phased(call: Call, run: Run, started: float) -> Outcome:
    """Claim the key with a committed `processing` record, then run in phases."""
    claim = records.claim(call)
    if claim.outcome is Claimed.EXISTING and claim.record is not None:
        return _answer(claim.record, call), None
    if claim.record is None or claim.locked_until is None:  # Claimed.BUSY
        raise in_flight()
    if claim.outcome is Claimed.TAKEN_OVER:
        metrics.count("taken_over")
    metrics.lock_wait.observe(time.perf_counter() - started)
    phases = Phases(
        claim.record.pk,
        claim.record.recovery_point,
        claim.data,
        claim.locked_until,
        resumed=claim.outcome is Claimed.TAKEN_OVER,
    )
    return run_phases(call.fingerprint, run, phases)


def run_phases(fingerprint: str, run: Run, phases: Phases) -> Outcome:
    """Run a claimed phased request to its end and store its answer (also how beat's
    completer finishes a request whose client never came back)."""
    try:
        response = run(phases)
    except LeaseLost:
        raise in_flight() from None
    except BaseException:
        records.release(phases.record_id, phases.locked_until, phases.recovery_point)
        raise
    if not should_store(response):
        records.release(phases.record_id, phases.locked_until, phases.recovery_point)
        metrics.count("released")
        return response, None
    stored = StoredResponse.of(fingerprint, response)
    if not records.finish(phases.record_id, phases.locked_until, stored):
        raise in_flight()
    metrics.count("executed")
    return response, stored


def _answer(record: IdempotencyRecord, call: Call) -> HttpResponse:
    """Check 2, on the record: another request → 422; finished → replay; else 409."""
    if not call.matches(record.fingerprint):
        raise _refuse_reuse(record, call)
    if record.finished:
        return replay(StoredResponse.of_record(record))
    raise in_flight()


def _answer_winner(call: Call) -> HttpResponse:
    """We lost the race for the key: answer with the winner's record. If it is gone
    again already (it expired in between), the client's retry will run afresh."""
    record = records.find(call)
    if record is None:
        raise in_flight()
    return _answer(record, call)


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
        f"This key was first used with a different request (changed: {named}); "
        "use a new key for a new operation.",
        fields=fields,
    )
