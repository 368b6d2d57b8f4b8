"""`make chaos BENCH_ARGS=--short`: the whole stack under load and chaos, audited.

Runs `bench/load.py --chaos --short` (about 40 s: gunicorn, a Celery worker and beat,
two redis-servers, PostgreSQL, agents that are SIGKILLed mid-request) as a subprocess
and holds it to its verdict: exit 0, and a final JSON line with no double debit, no
lost intent, no stuck key, a clean ledger, and chaos that really happened. Whatever
happens, every process group the run started is killed afterwards.
"""

import json
import sys

import pytest

from tests.servers import run_bench


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_short_chaos_run_ends_with_no_violation(tmp_path):
    status, output, left = run_bench(
        [sys.executable, "bench/load.py", "--chaos", "--short"],
        tmp_path / "run",
        # A database of its own, so a `make chaos` running meanwhile is not dropped.
        {"CHAOS_DB": "ledger_chaos_test"},
        timeout=360,
    )
    assert not left, f"process groups outlived the run: {left}"
    assert status == 0, output[-6000:]
    result = json.loads(output.strip().splitlines()[-1])
    assert result["double_debits"] == 0, result["violations"]
    assert result["lost_intents"] == 0, result["violations"]
    assert result["stuck_keys"] == 0, result["violations"]
    assert result["money_drift"] == 0, result["violations"]
    assert result["ledger_ok"] is True
    assert result["violations"] == []
    assert result["intents"] > 0 and result["requests"] > result["intents"]
    # The agents pay from the balance, through the provider, by a hold and its
    # capture, and send transfers (bench/agent.py).
    methods = {outcome.split()[0] for outcome in result["outcomes"]}
    assert {"balance", "provider", "hold", "transfer"} <= methods, result["outcomes"]
    assert result["replays"] > 0 and result["duplicate_callbacks"] > 0
    assert result["kills"] > 0
    assert {"gunicorn_worker", "agent_before_reading_reply"} <= set(
        result["kills_by_kind"]
    )
    for field in ("first_rps", "replay_rps", "p99_ms", "overhead_ratio"):
        assert result[field] > 0, field
