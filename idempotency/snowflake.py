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

Across processes, each needs a worker id no other live process holds. A setting alone
cannot give that: gunicorn and Celery fork several processes from one configuration.
So the worker id is split: 4 bits name the host (`SNOWFLAKE_NODE_ID`, 0..15, set per
machine) and 6 bits a slot (0..63) that each process claims on first use by `flock`ing
one of 64 slot files. The kernel releases the lock when the process exits, even on
SIGKILL, so slots never leak; a forked child sees a new pid and claims its own.
"""

import fcntl
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

# 2024-01-01T00:00:00Z: ids stay small and the 41 bits last until 2093.
EPOCH_MS = 1_704_067_200_000

TIMESTAMP_BITS = 41
WORKER_BITS = 10
SEQUENCE_BITS = 12
MAX_TIMESTAMP = (1 << TIMESTAMP_BITS) - 1
MAX_WORKER_ID = (1 << WORKER_BITS) - 1
SLOT_BITS = 6
MAX_NODE_ID = (1 << (WORKER_BITS - SLOT_BITS)) - 1
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
    """

    def __init__(
        self,
        *,
        worker_id: int,
        clock: Callable[[], int] = system_clock_ms,
        sleep: Callable[[float], None] = time.sleep,
        epoch_ms: int = EPOCH_MS,
        max_backwards_ms: int = DEFAULT_MAX_BACKWARDS_MS,
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
    """Every one of this host's 64 worker slots is held by a live process."""


def claim_worker_id(node_id: int, directory: Path) -> tuple[int, IO[str]]:
    """Claim a worker id no other live process on this host holds.

    Returns the id and the open slot file, which must stay open (and so locked) for
    as long as the process issues ids.
    """
    if not 0 <= node_id <= MAX_NODE_ID:
        raise ValueError(f"SNOWFLAKE_NODE_ID must be 0..{MAX_NODE_ID}, not {node_id}")
    directory.mkdir(parents=True, exist_ok=True)
    for slot in range(1 << SLOT_BITS):
        handle = (directory / f"slot-{slot}.lock").open("a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        return (node_id << SLOT_BITS) | slot, handle
    raise NoFreeWorkerSlot(
        f"all {1 << SLOT_BITS} worker slots in {directory} are taken"
    )


class _ProcessGenerator:
    """This process's generator, claimed lazily and again after a fork."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self._generator: SnowflakeGenerator | None = None
        self._slot_file: IO[str] | None = None

    def get(self) -> SnowflakeGenerator:
        pid = os.getpid()
        if self._pid != pid or self._generator is None:
            with self._lock:
                if self._pid != pid or self._generator is None:
                    from django.conf import settings

                    worker_id, self._slot_file = claim_worker_id(
                        settings.SNOWFLAKE_NODE_ID, settings.DATA_DIR / "snowflake"
                    )
                    self._generator = SnowflakeGenerator(worker_id=worker_id)
                    self._pid = pid
        return self._generator


_process = _ProcessGenerator()


def next_snowflake() -> int:
    """The next id of this process's generator (see the module doc for worker ids)."""
    return _process.get().next_id()
