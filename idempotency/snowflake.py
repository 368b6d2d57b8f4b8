"""Snowflake-style ids: unique, roughly time-ordered 63-bit integers, no database.

Layout, high bit to low: 41 bits of milliseconds since `EPOCH_MS` (about 69 years),
10 bits of worker id (so up to 1024 processes issue ids without talking to each other)
and a 12-bit sequence (4096 ids per worker per millisecond). Merchant order numbers are
these ids written as decimal strings.

Uniqueness rests on two rules. Within one process a lock serialises the generator, and
the sequence is only reset when the clock has moved past the last millisecond used;
when 4096 ids are used up within one millisecond the generator waits for the next one.
When the clock goes backwards (an NTP step, a VM migration) it waits up to a small
bound for the clock to catch up with the last millisecond it used, and otherwise
refuses with `ClockMovedBackwards`: a refused request can be retried, a duplicate
merchant order number cannot be taken back.

Across processes, and across hosts, each needs a worker id no other live process
holds. A setting cannot give that (gunicorn and Celery fork several processes from one
configuration, and hosts share one environment), nor can a host's filesystem. So each
process leases a worker id from the database on first use (`idempotency.leases`: a
row `snowflake:<id>` per id, `SNOWFLAKE_LEASE_SECONDS` long, timed by the database's
clock), renews it from a daemon thread every third of the lease, and a forked child
(a gunicorn or Celery worker) forgets its parent's lease and leases its own. A lease
is taken over only after it expired.

The timestamps come from the database's clock too: the lease's `db_now`, counted on
with this host's steady clock (`Lease.db_clock_ms`, a lower bound). That is what
makes a take-over safe even across hosts whose clocks disagree: the old holder issues
ids only before its lease's end (it stops at its `deadline`, a margin early), and the
new one only after it (its first millisecond is past the one the database took the
lease over in). A process that could not renew in time (frozen, or cut off from the
database) refuses with `IdIssuerUnavailable` (503) rather than risk a duplicate, and
leases a fresh id for the numbers after.

On the embedded SQLite default there is one host by construction (the database is a
file on it), and a lease could not be taken from inside a request's transaction (the
file has one writer at a time). There each process claims one of the 1024 worker ids
by `flock`ing a slot file in `LEDGER_DATA_DIR`: the kernel releases it when the
process exits, even on SIGKILL; a forked child claims its own.
"""

import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from django.db import DatabaseError, connection

from .exceptions import IdIssuerUnavailable
from .leases import Lease, LeaseStore, steady

logger = logging.getLogger(__name__)

# 2024-01-01T00:00:00Z: ids stay small and the 41 bits last until 2093.
EPOCH_MS = 1_704_067_200_000

TIMESTAMP_BITS = 41
WORKER_BITS = 10
SEQUENCE_BITS = 12
MAX_TIMESTAMP = (1 << TIMESTAMP_BITS) - 1
MAX_WORKER_ID = (1 << WORKER_BITS) - 1
# One lease per worker id, named `snowflake:<id>`.
WORKER_LEASES = [f"snowflake:{worker}" for worker in range(MAX_WORKER_ID + 1)]
MAX_SEQUENCE = (1 << SEQUENCE_BITS) - 1
WORKER_SHIFT = SEQUENCE_BITS
TIMESTAMP_SHIFT = SEQUENCE_BITS + WORKER_BITS

# How far back the clock may jump before we refuse instead of waiting it out.
DEFAULT_MAX_BACKWARDS_MS = 5


class ClockMovedBackwards(RuntimeError):
    """The system clock is behind the last millisecond an id was issued for."""


def system_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class SnowflakeParts:
    timestamp_ms: int  # Unix milliseconds
    worker_id: int
    sequence: int


def snowflake_parts(snowflake: int, *, epoch_ms: int = EPOCH_MS) -> SnowflakeParts:
    """Split an id back into its Unix milliseconds, worker id and sequence."""
    return SnowflakeParts(
        timestamp_ms=(snowflake >> TIMESTAMP_SHIFT) + epoch_ms,
        worker_id=(snowflake >> WORKER_SHIFT) & MAX_WORKER_ID,
        sequence=snowflake & MAX_SEQUENCE,
    )


class SnowflakeGenerator:
    """Issue unique ids for one worker; safe to share between threads.

    `clock` returns Unix milliseconds and `sleep` takes seconds; tests pass fakes.
    With `after_ms`, every id is of a later millisecond than that.
    """

    def __init__(
        self,
        *,
        worker_id: int,
        clock: Callable[[], int] = system_clock_ms,
        sleep: Callable[[float], None] = time.sleep,
        epoch_ms: int = EPOCH_MS,
        max_backwards_ms: int = DEFAULT_MAX_BACKWARDS_MS,
        after_ms: int | None = None,
    ) -> None:
        if isinstance(worker_id, bool) or not 0 <= worker_id <= MAX_WORKER_ID:
            raise ValueError(f"worker id must be 0..{MAX_WORKER_ID}, not {worker_id!r}")
        self.worker_id = worker_id
        self._clock = clock
        self._sleep = sleep
        self._epoch_ms = epoch_ms
        self._max_backwards_ms = max_backwards_ms
        self._lock = threading.Lock()
        self._last_ms = -1
        self._sequence = 0
        if after_ms is not None:
            # Ids start in the millisecond after `after_ms` (Unix ms): as if the
            # sequence of `after_ms` were used up.
            self._last_ms = after_ms - epoch_ms
            self._sequence = MAX_SEQUENCE

    def _now(self) -> int:
        return self._clock() - self._epoch_ms

    def _caught_up(self, now: int) -> int:
        """Wait, within the bound, for a clock that went backwards; or refuse."""
        behind = self._last_ms - now
        if behind > self._max_backwards_ms:
            raise ClockMovedBackwards(
                f"clock moved backwards by {behind} ms (more than the "
                f"{self._max_backwards_ms} ms we wait); refusing to issue an id"
            )
        self._sleep(behind / 1000)
        now = self._now()
        if now < self._last_ms:
            raise ClockMovedBackwards(
                f"clock still {self._last_ms - now} ms behind after waiting "
                f"{behind} ms; refusing to issue an id"
            )
        return now

    def _next_millisecond(self) -> int:
        """Wait until the clock passes the millisecond whose sequence is used up."""
        while True:
            self._sleep(0.0002)
            now = self._now()
            if now > self._last_ms:
                return now
            if now < self._last_ms:
                now = self._caught_up(now)
                if now > self._last_ms:
                    return now

    def next_id(self) -> int:
        with self._lock:
            now = self._now()
            if now < self._last_ms:
                now = self._caught_up(now)
            if now == self._last_ms:
                if self._sequence < MAX_SEQUENCE:
                    self._sequence += 1
                else:
                    now = self._next_millisecond()
                    self._sequence = 0
            else:
                self._sequence = 0
            if not 0 <= now <= MAX_TIMESTAMP:
                raise ClockMovedBackwards(
                    f"clock reads {now} ms from the epoch, outside the 41-bit range"
                )
            self._last_ms = now
            return (
                (now << TIMESTAMP_SHIFT)
                | (self.worker_id << WORKER_SHIFT)
                | self._sequence
            )


class NoFreeWorkerSlot(RuntimeError):
    """Every one of this host's 1024 worker slots is held by a live process."""


def claim_worker_slot(directory: Path) -> tuple[int, IO[str]]:
    """Claim a worker id no other live process on this host holds (SQLite only).

    Returns the id and the open slot file, which must stay open (and so locked) for
    as long as the process issues ids.
    """
    directory.mkdir(parents=True, exist_ok=True)
    for slot in range(MAX_WORKER_ID + 1):
        handle = (directory / f"slot-{slot}.lock").open("a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        return slot, handle
    raise NoFreeWorkerSlot(
        f"all {MAX_WORKER_ID + 1} worker slots in {directory} are taken"
    )


class LeaseEnded(RuntimeError):
    """The worker id's lease passed its deadline, or was lost, before this id."""


class LeasedClock:
    """Unix milliseconds of the database's clock, while the lease holds.

    Never goes backwards, though each renewal re-reads the database's clock (a lower
    bound each time, see `Lease.db_clock_ms`). Past the lease's deadline, less a
    margin for the steady clock's drift, it raises `LeaseEnded` instead.
    """

    def __init__(self, lease: Lease, *, margin: float) -> None:
        self.lease = lease
        self.margin = margin
        self.lost = False
        self._last = 0

    def __call__(self) -> int:
        now = steady()
        lease = self.lease
        if self.lost or now >= lease.deadline - self.margin:
            raise LeaseEnded(f"the lease on {lease.name} ended")
        self._last = max(self._last, lease.db_clock_ms(now))
        return self._last


@dataclass
class _Leased:
    lease: Lease | None  # None: a flock slot (SQLite)
    clock: LeasedClock | None
    generator: SnowflakeGenerator
    slot_file: IO[str] | None = None


def _lease_seconds() -> float:
    from django.conf import settings

    return float(settings.SNOWFLAKE_LEASE_SECONDS)


class _ProcessGenerator:
    """This process's worker id lease and generator; none is shared across a fork."""

    def __init__(self) -> None:
        self._store = LeaseStore()
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._leased: _Leased | None = None
        self._renewer: threading.Thread | None = None
        self._stop = threading.Event()

    def after_fork_in_child(self) -> None:
        """A forked child must never issue ids with its parent's worker id: it
        forgets the lease (and the parent's connection, locks and threads) and
        leases its own on first use."""
        self._store.forget()
        self._reset()

    def next_id(self) -> int:
        if os.getpid() != self._pid:  # forked without the fork hook (not CPython?)
            self.after_fork_in_child()
        with self._lock:
            leased = self._leased
            if leased is None:
                leased = self._leased = self._acquire()
                if leased.lease is not None:
                    self._start_renewer()
        try:
            return leased.generator.next_id()
        except LeaseEnded as ended:
            with self._lock:
                if self._leased is leased:
                    self._leased = None  # the next number comes from a fresh lease
            logger.error("refusing to issue an id: %s", ended)
            raise IdIssuerUnavailable() from ended

    @property
    def worker_id(self) -> int | None:
        leased = self._leased
        return None if leased is None else leased.generator.worker_id

    def _acquire(self) -> _Leased:
        if connection.vendor == "sqlite":
            from django.conf import settings

            worker_id, slot_file = claim_worker_slot(settings.DATA_DIR / "snowflake")
            return _Leased(
                None, None, SnowflakeGenerator(worker_id=worker_id), slot_file
            )
        seconds = _lease_seconds()
        try:
            lease = self._store.acquire(WORKER_LEASES, seconds=seconds)
        except DatabaseError as error:
            logger.error("could not lease a worker id: %s", error)
            raise IdIssuerUnavailable() from error
        if lease is None:
            logger.error("all %s worker ids are leased", len(WORKER_LEASES))
            raise IdIssuerUnavailable("Every worker id is leased. Retry later.")
        worker_id = int(lease.name.rsplit(":", 1)[1])
        clock = LeasedClock(lease, margin=seconds / 10)
        generator = SnowflakeGenerator(
            worker_id=worker_id, clock=clock, after_ms=lease.db_clock_ms(lease.received)
        )
        logger.info("leased worker id %s as %s", worker_id, lease.holder)
        return _Leased(lease, clock, generator)

    def _start_renewer(self) -> None:
        if self._renewer is None or not self._renewer.is_alive():
            self._stop = threading.Event()
            self._renewer = threading.Thread(
                target=self._renew_loop,
                args=(self._stop,),
                name="snowflake-lease",
                daemon=True,
            )
            self._renewer.start()

    def _renew_loop(self, stop: threading.Event) -> None:
        """Renew the lease every third of its length; after a failure, every
        second (until its deadline, when `next_id` starts refusing)."""
        wait = _lease_seconds() / 3
        while not stop.wait(wait):
            wait = _lease_seconds() / 3
            leased = self._leased
            if leased is None or leased.lease is None or leased.clock is None:
                continue
            if leased.clock.lost:
                continue
            try:
                renewed = self._store.renew(leased.lease, seconds=_lease_seconds())
            except Exception as error:  # the database is away: try again soon
                logger.warning("could not renew %s: %s", leased.lease.name, error)
                wait = min(1.0, wait)
                continue
            if renewed is None:
                logger.error("lost the lease on %s", leased.lease.name)
                leased.clock.lost = True
            else:
                leased.clock.lease = leased.lease = renewed

    def forget(self) -> None:
        """Stop renewing, and drop the lease and the connection (it lapses by
        itself). For tests that flush or drop the database under this process."""
        self._stop.set()
        renewer = self._renewer
        if renewer is not None and renewer is not threading.current_thread():
            renewer.join(timeout=10)
        self._renewer = None
        with self._lock:
            self._leased = None
        self._store.close()


_process = _ProcessGenerator()
os.register_at_fork(after_in_child=lambda: _process.after_fork_in_child())


def next_snowflake() -> int:
    """The next id of this process's generator (see the module doc for worker ids)."""
    return _process.next_id()


def forget_worker_lease() -> None:
    """Let this process lease a fresh worker id on its next number (see `forget`)."""
    _process.forget()
