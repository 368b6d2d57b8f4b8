"""`make chaos-cluster BENCH_ARGS=--short`: the chaos run across three app hosts.

Runs `bench/cluster.py --short` (about two minutes: three hosts with their own
hostname and filesystem, one of them three minutes ahead, nginx, a Redis Cluster,
RabbitMQ) and holds it to the verdict: no violation, chaos on every part that the
scale-out adds (a whole host, the beat host, a Redis primary, the broker), and no
process group left behind.
"""

import json
import sys

import pytest

from tests.servers import run_bench


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
