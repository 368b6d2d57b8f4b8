"""One beat acts at a time (`ledger.beat`), and every periodic task is safe twice.

Two real `celery beat` processes on the test database and the test broker (a Redis
of its own, TEST_BROKER_URL): each periodic task is sent once per interval, not
twice; after the leader is killed the other takes over, once the lease expired.
"""

import importlib
import json
import os
import signal
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from idempotency.leases import LeaseStore
from idempotency.models import IdempotencyRecord, Lease
from ledger.invariants import ledger_report
from orders.models import Order, PreOrder
from payments.models import CallbackNonce
from tests.conftest import run_in_threads
from tests.helpers import customer, place_order
from tests.servers import ROOT, stop
from tests.workers import BROKER_URL, process_env

pytestmark = pytest.mark.django_db(transaction=True)


def periodic_task(name: str):
    module, function = name.rsplit(".", 1)
    return getattr(importlib.import_module(module), function)


def test_every_periodic_task_is_safe_when_two_run_at_once(on_postgres):
    """What two beats (or a beat and an operator) would do: each task of the
    schedule, twice at the same instant, on work for it to do."""
    user, _, _ = customer("beat-twice", balance=10_000)
    old = timezone.now() - timedelta(days=3)
    unpaid = place_order(user)
    Order.objects.filter(pk=unpaid.pk).update(created_at=old)
    PreOrder.objects.create(merchant_order_no="1", owner=user, expires_at=old)
    CallbackNonce.objects.bulk_create(
        CallbackNonce(nonce=f"n{i}", expires_at=old) for i in range(5)
    )
    IdempotencyRecord.objects.bulk_create(
        IdempotencyRecord(
            scope="beat",
            key=f"k{i}",
            endpoint="e",
            method="POST",
            path="/",
            fingerprint="f",
            status="succeeded",
            created_at=old,
            expires_at=old,
        )
        for i in range(5)
    )
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        task = periodic_task(entry["task"])
        results = run_in_threads(2, lambda _, task=task: task())
        assert not [r for r in results if isinstance(r, Exception)], (task, results)
    unpaid.refresh_from_db()
    assert unpaid.status == Order.Status.CANCELLED
    assert not PreOrder.objects.filter(merchant_order_no="1").exists()
    assert not CallbackNonce.objects.exists()
    assert not IdempotencyRecord.objects.filter(scope="beat").exists()
    assert ledger_report()["ok"]


def start_beat(tmp_path: Path, name: str, **extra: str) -> subprocess.Popen:
    log = (tmp_path / f"{name}.log").open("w")
    return subprocess.Popen(
        [
            str(ROOT / ".venv/bin/celery"),
            "-A",
            "ledger",
            "beat",
            "--loglevel=INFO",
            f"--pidfile={tmp_path / name}.pid",
        ],
        cwd=ROOT,
        env=process_env(
            DJANGO_SETTINGS_MODULE="tests.ops.beat_settings", HOSTNAME=name, **extra
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_for_log(tmp_path: Path, name: str, text: str, seconds: float = 30) -> None:
    path = tmp_path / f"{name}.log"
    deadline = time.monotonic() + seconds
    while text not in path.read_text():
        assert time.monotonic() < deadline, f"{name}: no {text!r}:\n{path.read_text()}"
        time.sleep(0.1)


def sent(broker: redis.Redis) -> dict[str, int]:
    """How many of each task sit in the default queue (no worker takes them)."""
    counts: dict[str, int] = {}
    for raw in broker.lrange("celery", 0, -1):
        task = json.loads(raw)["headers"]["task"]
        counts[task] = counts.get(task, 0) + 1
    return counts


def count_for(broker: redis.Redis, seconds: float) -> dict[str, int]:
    broker.delete("celery")
    time.sleep(seconds)
    return sent(broker)


def assert_once_per_interval(counts: dict[str, int], seconds: float) -> None:
    # Each task about once per interval over `seconds`: two acting beats would send
    # twice as many. (A beat slowed by a busy machine sends fewer, never more.)
    every_second = counts.get("idempotency.tasks.purge_expired_keys", 0)
    every_two = counts.get("ledger.tasks.check_invariants", 0)
    assert seconds / 2 <= every_second <= seconds + 1, counts
    assert 1 <= every_two <= seconds / 2 + 1, counts


@pytest.mark.slow
def test_two_beats_one_leader_and_a_take_over_after_the_leader_dies(
    tmp_path, on_postgres
):
    broker = redis.Redis.from_url(BROKER_URL)
    broker.flushdb()
    first = start_beat(tmp_path, "beat-a")
    second = None
    try:
        wait_for_log(tmp_path, "beat-a", "beat: leading")
        second = start_beat(tmp_path, "beat-b")
        wait_for_log(tmp_path, "beat-b", "beat: Starting...")
        time.sleep(2)  # both running, one leading
        lease = Lease.objects.get(name="beat")
        assert lease.holder.startswith("beat-a:")
        assert_once_per_interval(count_for(broker, 8), 8)
        assert "leading" not in (tmp_path / "beat-b.log").read_text()

        # The leader dies without a word (no release): the other waits out the
        # lease (3 s), then leads.
        killed = time.monotonic()
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        wait_for_log(tmp_path, "beat-b", "beat: leading", seconds=15)
        took = time.monotonic() - killed
        assert took >= 1.5, "taken over before the lease could have expired"
        assert Lease.objects.get(name="beat").holder.startswith("beat-b:")
        assert_once_per_interval(count_for(broker, 8), 8)
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                stop(process)
        broker.flushdb()


def test_a_live_leader_is_not_taken_over(on_postgres):
    """While the leader renews, a second beat's try fails every time."""
    leader, other = LeaseStore(), LeaseStore()
    try:
        held = leader.acquire(["beat"], seconds=1)
        assert held is not None
        for _ in range(3):
            time.sleep(0.4)
            held = leader.renew(held, seconds=1)
            assert held is not None
            assert other.acquire(["beat"], seconds=1) is None
    finally:
        leader.close()
        other.close()
