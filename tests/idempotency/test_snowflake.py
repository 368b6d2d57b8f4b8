"""The Snowflake generator on a fake clock: no duplicate, whatever the clock does."""

import os
import threading

import pytest
from django.db import connection

from idempotency.models import Lease
from idempotency.snowflake import (
    EPOCH_MS,
    MAX_SEQUENCE,
    ClockMovedBackwards,
    SnowflakeGenerator,
    _process,
    next_snowflake,
    snowflake_parts,
)
from tests.conftest import run_in_threads

START_MS = EPOCH_MS + 1_000_000


class FakeClock:
    """Unix milliseconds that move only when a test (or a sleep) moves them.

    With `sleeps_advance=False` sleeping does not move the clock: a clock that is stuck
    behind."""

    def __init__(self, ms: int = START_MS, *, sleeps_advance: bool = True) -> None:
        self.ms = float(ms)
        self.sleeps_advance = sleeps_advance
        self.slept: list[float] = []
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return int(self.ms)

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.slept.append(seconds)
            if self.sleeps_advance:
                self.ms += seconds * 1000

    def set(self, ms: int) -> None:
        with self._lock:
            self.ms = float(ms)


def generator(clock: FakeClock, worker_id: int = 7) -> SnowflakeGenerator:
    return SnowflakeGenerator(worker_id=worker_id, clock=clock, sleep=clock.sleep)


def test_layout_timestamp_worker_and_sequence():
    clock = FakeClock()
    gen = generator(clock, worker_id=1023)
    first, second = gen.next_id(), gen.next_id()
    assert snowflake_parts(first).timestamp_ms == START_MS
    assert snowflake_parts(first).worker_id == 1023
    assert (snowflake_parts(first).sequence, snowflake_parts(second).sequence) == (0, 1)
    clock.set(START_MS + 1)
    third = gen.next_id()
    assert snowflake_parts(third).sequence == 0  # a new millisecond starts over
    assert first < second < third
    assert third.bit_length() <= 63  # fits a signed 64-bit column


def test_ids_are_time_ordered_across_milliseconds():
    clock = FakeClock()
    gen = generator(clock)
    ids = []
    for step in range(50):
        clock.set(START_MS + step * 3)
        ids.extend(gen.next_id() for _ in range(5))
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_sequence_overflow_waits_for_the_next_millisecond():
    clock = FakeClock()
    gen = generator(clock)
    ids = [gen.next_id() for _ in range(MAX_SEQUENCE + 1)]  # 4096 in one millisecond
    assert {snowflake_parts(i).timestamp_ms for i in ids} == {START_MS}
    assert clock.slept == []
    overflow = gen.next_id()
    parts = snowflake_parts(overflow)
    assert parts.timestamp_ms == START_MS + 1 and parts.sequence == 0
    assert clock.slept, "it must wait for the clock, not invent a millisecond"
    assert overflow > ids[-1] and overflow not in ids


def test_small_backwards_step_is_waited_out_without_a_duplicate():
    clock = FakeClock()
    gen = generator(clock)
    clock.set(START_MS + 10)
    before = [gen.next_id() for _ in range(3)]
    clock.set(START_MS + 7)  # NTP stepped the clock back 3 ms
    after = gen.next_id()
    assert clock.slept == [0.003]
    assert after > before[-1] and after not in before
    assert snowflake_parts(after).timestamp_ms == START_MS + 10
    assert snowflake_parts(after).sequence == 3  # continues the same millisecond


def test_large_backwards_step_is_refused_at_once():
    clock = FakeClock()
    gen = generator(clock)
    clock.set(START_MS + 5000)
    issued = gen.next_id()
    clock.set(START_MS + 4000)
    with pytest.raises(ClockMovedBackwards, match="1000 ms"):
        gen.next_id()
    assert clock.slept == []  # no long stall while holding the lock
    clock.set(START_MS + 5000)  # once the clock is back, ids continue after `issued`
    assert gen.next_id() > issued


def test_clock_stuck_behind_after_the_wait_is_refused():
    clock = FakeClock(sleeps_advance=False)
    gen = generator(clock)
    clock.set(START_MS + 10)
    gen.next_id()
    clock.set(START_MS + 8)
    with pytest.raises(ClockMovedBackwards, match="after waiting"):
        gen.next_id()
    assert clock.slept == [0.002]


def test_worker_id_is_validated():
    for bad in (-1, 1024, True):
        with pytest.raises(ValueError, match="worker id"):
            SnowflakeGenerator(worker_id=bad)


def test_two_threads_issue_200000_unique_ids():
    """Only sleeping moves this clock, so the threads exhaust the sequence of every
    millisecond and contend on the overflow path ~49 times."""
    clock = FakeClock()
    gen = generator(clock)
    per_thread = 100_000

    def issue(_: int) -> list[int]:
        return [gen.next_id() for _ in range(per_thread)]

    first, second = run_in_threads(2, issue)
    assert isinstance(first, list) and isinstance(second, list)
    assert first == sorted(first) and second == sorted(second)
    every = set(first) | set(second)
    assert len(every) == 2 * per_thread
    assert len({snowflake_parts(i).timestamp_ms for i in every}) >= 49


def test_two_generators_with_different_workers_never_collide():
    clock = FakeClock()
    a, b = generator(clock, worker_id=1), generator(clock, worker_id=2)
    ids_a = {a.next_id() for _ in range(5000)}
    ids_b = {b.next_id() for _ in range(5000)}
    assert not ids_a & ids_b


@pytest.mark.django_db
def test_process_generator_leases_its_worker_id():
    first, second = next_snowflake(), next_snowflake()
    assert snowflake_parts(first).worker_id == _process.worker_id
    assert second > first
    if connection.vendor == "postgresql":  # SQLite: a flock slot on the one host
        lease = Lease.objects.get(name=f"snowflake:{_process.worker_id}")
        assert lease.holder.split(":")[1] == str(os.getpid())


@pytest.mark.django_db
def test_forked_processes_issue_distinct_numbers():
    """gunicorn forks workers from one configuration; each leases its own id."""
    next_snowflake()  # the parent has claimed a slot before forking
    read, write = os.pipe()
    hold, release = os.pipe()  # children stay alive (holding slots) until released
    children = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:  # the child: report one id, wait, leave without any teardown
            os.close(release)
            os.write(write, f"{next_snowflake()}\n".encode())
            os.read(hold, 1)
            os._exit(0)
        children.append(pid)
    os.close(write)
    os.close(hold)
    with os.fdopen(read) as pipe:
        lines = [pipe.readline() for _ in children]
    os.close(release)
    for pid in children:
        os.waitpid(pid, 0)
    ids = [int(line) for line in lines]
    workers = {snowflake_parts(i).worker_id for i in ids}
    assert len(ids) == 4 and len(workers) == 4
    assert snowflake_parts(next_snowflake()).worker_id not in workers
