"""`make chaos BENCH_ARGS=--short`: the whole stack under load and chaos, audited.

Runs `bench/load.py --chaos --short` (about 40 s: gunicorn, a Celery worker and beat,
two redis-servers, PostgreSQL, agents that are SIGKILLed mid-request) as a subprocess
and holds it to its verdict: exit 0, and a final JSON line with no double debit, no
lost intent, no stuck key, a clean ledger, and chaos that really happened. Whatever
happens, every process group the run started is killed afterwards.
"""

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def groups_alive(pgids: list[int]) -> list[int]:
    alive = []
    for pgid in pgids:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:  # pragma: no cover - reused by someone else's group
            continue
        alive.append(pgid)
    return alive


def started_groups(workdir: Path) -> list[int]:
    path = workdir / "pgids"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def kill_groups(pgids: list[int]) -> None:
    for pgid in pgids:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def wait_until_gone(pgids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (alive := groups_alive(pgids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


@pytest.mark.slow
@pytest.mark.timeout(290)
def test_the_short_chaos_run_ends_with_no_violation(tmp_path):
    workdir = tmp_path / "run"
    process = subprocess.Popen(
        [
            sys.executable,
            "bench/load.py",
            "--chaos",
            "--short",
            "--workdir",
            str(workdir),
        ],
        cwd=ROOT,
        # A database of its own, so a `make chaos` running meanwhile is not dropped.
        env={**os.environ, "CHAOS_DB": "ledger_chaos_test"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)  # the runner cleans up on SIGTERM
        with suppress(subprocess.TimeoutExpired):
            process.communicate(timeout=20)
        raise
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        pgids = started_groups(workdir)
        left = wait_until_gone(pgids, 5)
        kill_groups(left)

    assert not left, f"process groups outlived the run: {left}"
    assert process.returncode == 0, output[-6000:]
    assert pgids, "the run started no processes"
    result = json.loads(output.strip().splitlines()[-1])
    assert result["double_debits"] == 0, result["violations"]
    assert result["lost_intents"] == 0, result["violations"]
    assert result["stuck_keys"] == 0, result["violations"]
    assert result["money_drift"] == 0, result["violations"]
    assert result["ledger_ok"] is True
    assert result["violations"] == []
    assert result["intents"] > 0 and result["requests"] > result["intents"]
    assert result["replays"] > 0 and result["duplicate_callbacks"] > 0
    assert result["kills"] > 0
    assert {"gunicorn_worker", "agent_before_reading_reply"} <= set(
        result["kills_by_kind"]
    )
    for field in ("first_rps", "replay_rps", "p99_ms", "overhead_ratio"):
        assert result[field] > 0, field
