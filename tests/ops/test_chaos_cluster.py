"""`make chaos-cluster BENCH_ARGS=--short`: the chaos run across three app hosts.

Runs `bench/cluster.py --short` (about two minutes: three hosts with their own
hostname and filesystem, one of them three minutes ahead, nginx, a Redis Cluster,
RabbitMQ) and holds it to the verdict: no violation, chaos on every part that the
scale-out adds (a whole host, the beat host, a Redis primary, the broker), and no
process group left behind.
"""

import json
import subprocess
import sys
import time

import pytest

from bench.cluster import celery_pool_pids, command
from tests.servers import children, run_bench, stop

FAKE_CELERY = """
import os, sys, time
for _ in range(2):  # the pool
    if os.fork() == 0:
        time.sleep(300)
        os._exit(0)
os.wait()
"""


@pytest.mark.slow
@pytest.mark.timeout(540)
def test_the_short_cluster_chaos_run_ends_with_no_violation(tmp_path):
    status, output, left = run_bench(
        [sys.executable, "bench/cluster.py", "--short"],
        tmp_path / "run",
        {"CHAOS_DB": "ledger_chaos_cluster_test"},
        timeout=480,
    )
    assert not left, f"process groups outlived the run: {left}"
    assert status == 0, output[-6000:]
    result = json.loads(output.strip().splitlines()[-1])
    assert result["violations"] == []
    assert result["double_debits"] == result["lost_intents"] == 0
    assert result["duplicate_order_numbers"] == 0
    assert result["ledger_ok"] is True
    assert result["hosts"] == 3 and result["broker"] == "rabbitmq"
    assert result["redis_cluster_primaries"] == 3
    assert result["redis_failovers"] >= 1
    assert {"host", "beat_host", "redis_primary", "rabbitmq_restart"} <= set(
        result["kills_by_kind"]
    ), result["kills_by_kind"]
    assert result["intents"] > 0 and result["replays"] > 0
    # Payments landed on the merchant's sub-accounts (MERCHANT_SUB_ACCOUNTS=4),
    # and beat swept them while hosts died.
    assert result["merchant_sub_accounts_paid"] >= 2
    assert result["merchant_sweeps"] >= 1


def test_the_chaos_kills_pool_processes_not_what_the_host_script_started(tmp_path):
    """A host is `sh -c <script>`, and the script names `celery ... worker` too: the
    children of the shell (gunicorn's master, the worker itself, beat) are not the
    pool processes a "Celery pool process" kill may take."""
    celery = tmp_path / "celery"
    celery.write_text(FAKE_CELERY)
    script = (
        "sleep 300 &  # gunicorn ledger.wsgi\n"
        f"{sys.executable} {celery} -A ledger worker --pool=prefork &\n"
        "wait"
    )
    host = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while (
            time.monotonic() < deadline and len(pool := celery_pool_pids(host.pid)) < 2
        ):
            time.sleep(0.05)
        started = children(host.pid)  # by the shell: the sleep and the worker
        (worker,) = [pid for pid in started if "worker" in command(pid)]
        assert sorted(pool) == sorted(children(worker))
        assert len(pool) == 2 and not set(started) & set(pool)
    finally:
        stop(host)
