"""`Prefer: wait=N`: wait for the request that holds a key to finish, instead of 409.

With Redis the waiter sleeps on a notification: it subscribes to the key's channel,
which every release of the key's Redis lock publishes on (`fastpath.finish`), so
nobody polls. Without Redis (or when Redis has no lock for the key: it was lost) the
wait is on the database, bounded by the deadline: first on the key's advisory lock,
which an atomic request holds until it commits, then on the record of a phased one,
until it is finished or its holder lets go of it (fails and releases it, or dies).

A notification says "look again", not "finished": the lock's holder may have been
another duplicate (the first request's lock was lost, a second one took the free
lock, found the key in flight and let go). So every wake-up is checked against the
database, and a key still in flight is waited for again, up to the deadline.
"""

import time

from . import fastpath, records
from .models import IdempotencyRecord
from .records import Call

POLL_SECONDS = 0.1  # without a Redis lock to wait on; after a walk found it busy


def until_finished(call: Call, seconds: float) -> None:
    """Return once the key's request has finished (or let go of the key), or
    `seconds` have passed; never because of a notification alone."""
    deadline = time.monotonic() + seconds
    notified = True
    while notified and (left := deadline - time.monotonic()) > 0:
        # False at once when Redis has no lock for the key: then the database only.
        notified = fastpath.wait_for_finish(call.scope, call.key, left)
        if _done(call, deadline):
            return
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(POLL_SECONDS, left))
        if _done(call, deadline):
            return


def _done(call: Call, deadline: float) -> bool:
    """The database says the key is no longer in flight: its record is finished or
    let go, or there is none and no request holds the key's advisory lock (an atomic
    one's record commits with its effect: waited for, up to the deadline)."""
    record = records.find(call)
    if record is not None:
        return record.finished or _let_go(record)
    records.wait_for_lock(call, deadline - time.monotonic())
    if deadline - time.monotonic() <= 0:
        return False  # still held at the deadline (the caller's walk looks anyway)
    record = records.find(call)
    return record is None or record.finished or _let_go(record)


def _let_go(record: IdempotencyRecord) -> bool:
    """Its holder's lease has ended, by the database's clock: the holder failed and
    released the key, or died; the waiter may take it over and resume it now."""
    now = record.db_now  # type: ignore[attr-defined]  # (records.find reads it)
    return record.locked_until is not None and record.locked_until <= now


def preferred_wait(prefer: str | None) -> int:
    """The seconds a `Prefer` header asks to wait (RFC 7240 `wait=N`), 1..10: a
    larger value counts as 10, anything but a positive integer as no preference."""
    for preference in (prefer or "").split(","):
        # `wait=5; param`: what follows `;` is the preference's parameters.
        name, _, value = preference.partition(";")[0].strip().partition("=")
        if name.strip().lower() == "wait":
            value = value.strip().strip('"')
            digits = value.lstrip("0")
            if not (value.isascii() and value.isdigit() and digits):
                return 0
            # (Length first: int() of 4,301 digits raises.)
            return min(int(digits), 10) if len(digits) < 3 else 10
    return 0
