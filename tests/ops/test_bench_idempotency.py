"""`make bench-idempotency`, end to end at tiny sizes, so that it cannot rot.

Runs `bench/idempotency_overhead.py --quick` (its own database, redis-servers,
gunicorns and Celery worker; about a minute) and checks that it exits 0, that its
last line is the JSON of every figure issue 19 names, that ours never executed twice,
and that no process it started outlives it.
"""

import json
import sys

import pytest

from tests.servers import run_bench

FIGURES = {
    "double_executions",
    "lost_executions",
    "errors",
    "powertools_measured",
    "powertools_first_ratio_c8",
    "powertools_first_ratio_c32",
    "powertools_double_executions_after_crash",
    "pay_first_ratio_c8",
    "pay_first_ratio_c32",
    "first_vs_floor_c8",
    "first_vs_floor_c32",
    "replay_ratio_c8",
    "replay_ratio_c32",
    "lookup_ms_ratio_10m_vs_10k",
    "purge_p99_ratio",
    "purge_keys_per_s",
    "hot_merchant_ratio",
    "hot_merchant_sub_accounts_ratio",
    "rss_mb_web",
    "rss_mb_worker",
}


@pytest.mark.slow
@pytest.mark.timeout(290)
def test_the_quick_benchmark_prints_every_figure(tmp_path):
    status, output, left = run_bench(
        [sys.executable, "bench/idempotency_overhead.py", "--quick"],
        tmp_path / "run",
        {},
        timeout=240,
    )
    assert not left, f"process groups outlived the run: {left}"
    assert status == 0, output[-6000:]
    result = json.loads(output.strip().splitlines()[-1])
    assert not FIGURES - set(result), "figures missing"
    # The targets' ratios of the totals too, beside the median rounds'.
    ratios = (
        "first_vs_floor",
        "replay_ratio",
        "pay_first_ratio",
        "powertools_first_ratio",
    )
    assert set(result["pooled"]) == {
        f"{name}_c{c}" for name in ratios for c in (8, 32)
    } | {"hot_merchant_ratio", "hot_merchant_sub_accounts_ratio"}
    assert all(value > 0 for value in result["pooled"].values())
    assert result["double_executions"] == 0
    assert result["powertools_measured"] == 1
    # The crash test really crashed: Powertools runs the killed request again.
    assert result["powertools_double_executions_after_crash"] == 1
    for name in FIGURES - {"double_executions", "lost_executions", "errors"}:
        assert result[name] > 0, name
    assert set(result["growth"]) == {"1000", "3000", "10000"}
    # The sub-accounts' slice paid into merchant 0's eight sub-accounts.
    assert result["hot_merchant"]["sub_accounts_used"] == 8


def test_a_stall_in_one_slice_moves_the_ratio_of_the_totals_not_the_median_round():
    from bench.idempotency_overhead import pooled, ratio

    def measured(*rounds: float) -> dict:
        return {"ok_rps": sum(rounds) / len(rounds), "rounds_ok_rps": list(rounds)}

    bare, first = measured(100, 100, 100, 100, 100), measured(90, 90, 90, 90, 9)
    assert ratio(first, bare) == 0.9
    assert pooled(first, bare) == 0.738
    # Without rounds (measured alone), the totals are all there is.
    assert ratio({"ok_rps": 45.0}, {"ok_rps": 50.0}) == 0.9
