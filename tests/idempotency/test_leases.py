"""Worker id leases in PostgreSQL: many processes on several hosts, no duplicate.

The lease table belongs to the test database; each process here is a real one
(`tests/idempotency/minter.py`), on a "host" of its own: its own HOSTNAME and
LEDGER_DATA_DIR, the same environment otherwise (as pods of one deployment).
"""

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from idempotency.leases import LeaseStore
from idempotency.models import Lease
from idempotency.snowflake import (
    EPOCH_MS,
    _process,
    forget_worker_lease,
    snowflake_parts,
)
from tests.helpers import assert_problem, customer, new_key
from tests.servers import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def host_env(host: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    db = connection.settings_dict
    data_dir = tmp_path / host
    data_dir.mkdir(exist_ok=True)
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "ledger.settings.test",
        "DATABASE_URL": (
            f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
        ),
        "HOSTNAME": host,
        "LEDGER_DATA_DIR": str(data_dir),
        **extra,
    }


def minter(env: dict[str, str], *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.idempotency.minter", *args],
        cwd=ROOT,
        env=env,
        **kwargs,
    )


@pytest.fixture
def on_postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("several processes share a worker id table on PostgreSQL")


def test_processes_on_three_hosts_never_issue_the_same_number(
    tmp_path, on_postgres_only
):
    """3 hosts x 3 processes, each forking 3 children (as gunicorn and Celery do):
    36 processes issue 3000 numbers each at the same time."""
    out = tmp_path / "numbers"
    out.mkdir()
    processes = [
        minter(host_env(f"host-{host}", tmp_path), "burst", "3", "3000", str(out))
        for host in range(3)
        for _ in range(3)
    ]
    for process in processes:
        assert process.wait(timeout=240) == 0
    files = list(out.glob("*.txt"))
    assert len(files) == 36
    numbers = [int(n) for f in files for n in f.read_text().split()]
    assert len(numbers) == 36 * 3000
    assert len(set(numbers)) == len(numbers), "a number was issued twice"
    # Every process had a worker id of its own (none lived past another's lease).
    workers = [
        {snowflake_parts(int(n)).worker_id for n in f.read_text().split()}
        for f in files
    ]
    assert all(len(w) == 1 for w in workers)
    assert len(set().union(*workers)) == 36
    holders = Lease.objects.filter(name__startswith="snowflake:").values_list(
        "holder", flat=True
    )
    assert {h.split(":")[0] for h in holders} >= {"host-0", "host-1", "host-2"}


def test_a_lease_is_taken_over_only_after_it_expired(on_postgres_only):
    first, second = LeaseStore(), LeaseStore()
    try:
        held = first.acquire(["test:one"], seconds=1.5)
        assert held is not None
        assert second.acquire(["test:one"], seconds=1.5) is None  # live: not taken
        renewed = first.renew(held, seconds=1.5)
        assert renewed is not None and renewed.expires_at > held.expires_at
        time.sleep(1.7)
        taken = second.acquire(["test:one"], seconds=30)
        assert taken is not None and taken.holder != held.holder
        assert taken.db_now > renewed.expires_at  # by the database's clock
        assert first.renew(renewed, seconds=30) is None  # the old holder lost it
        second.release(taken)
        assert first.acquire(["test:one"], seconds=30) is not None  # free at once
    finally:
        first.close()
        second.close()


def test_host_clock_skew_does_not_move_leases(monkeypatch, on_postgres_only):
    """A host whose clock runs an hour fast still cannot take a live lease."""
    real_now = timezone.now
    monkeypatch.setattr(
        "django.utils.timezone.now", lambda: real_now() + timedelta(hours=1)
    )
    first, second = LeaseStore(), LeaseStore()
    try:
        held = first.acquire(["test:skew"], seconds=30)
        assert held is not None
        assert abs(held.db_now - real_now()) < timedelta(seconds=5)
        assert second.acquire(["test:skew"], seconds=30) is None
    finally:
        first.close()
        second.close()


def test_a_frozen_holder_refuses_to_issue_after_its_lease_was_taken_over(
    tmp_path, on_postgres_only
):
    env = host_env("host-frozen", tmp_path, SNOWFLAKE_LEASE_SECONDS="2")
    process = minter(
        env, "serve", stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdin and process.stdout
    taker = LeaseStore()

    def ask() -> str:
        process.stdin.write("mint\n")
        process.stdin.flush()
        return process.stdout.readline().strip()

    try:
        first = int(ask())
        worker = snowflake_parts(first).worker_id
        name = f"snowflake:{worker}"
        os.kill(process.pid, signal.SIGSTOP)
        assert taker.acquire([name], seconds=60) is None  # live: not taken over
        deadline = time.monotonic() + 10
        taken = None
        while taken is None:
            assert time.monotonic() < deadline
            time.sleep(0.2)
            taken = taker.acquire([name], seconds=60)
        # The taker's numbers (had it any) start after the holder's lease ended.
        assert taken.db_now.timestamp() * 1000 > (first >> 22) + EPOCH_MS
        os.kill(process.pid, signal.SIGCONT)
        assert ask() == "refused id_issuer_unavailable"
        # Its next number comes from a fresh lease, never the one taken over.
        after = int(ask())
        assert snowflake_parts(after).worker_id != worker
        assert after > first
    finally:
        os.kill(process.pid, signal.SIGCONT)
        process.kill()
        process.wait(timeout=10)
        taker.close()


def test_a_process_that_cannot_renew_answers_503_and_stores_nothing(
    settings, on_postgres_only
):
    """The renewer stops (as when the database is out of reach): once the lease's
    deadline passes, pre-orders are refused, problem+json, and the key stays free."""
    settings.SNOWFLAKE_LEASE_SECONDS = 1
    forget_worker_lease()
    _, client, _ = customer("lease-alice")

    def preorder(key: str):
        return client.post("/api/v1/preorders", {}, headers={"Idempotency-Key": key})

    assert preorder(new_key()).status_code == 201
    _process._stop.set()  # no more renewals
    time.sleep(1.2)
    key = new_key()
    refused = preorder(key)
    assert_problem(refused, 503, "id_issuer_unavailable")
    assert refused["Retry-After"] == "1"
    again = preorder(key)  # a fresh lease: the same key now runs
    assert again.status_code == 201 and "Idempotent-Replayed" not in again
    forget_worker_lease()
