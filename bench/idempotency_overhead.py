"""What does the idempotency layer cost, what does a replay save, and how does it
compare with the other ways to do it?

Starts gunicorn (4 sync workers) on PostgreSQL + Redis on this machine, then drives
two real write endpoints (the benchmark settings make their key optional):

  * POST /api/v1/preorders, the smallest write there is: one autocommit INSERT;
  * POST /api/v1/orders, a typical one: a transaction of a few statements;

each at 8 and 32 concurrent keep-alive clients
  * without the layer (no Idempotency-Key),
  * with it, every request a first execution (a new key each),
  * with it, every request a replay of a finished key (served from Redis).
Without and with alternate in slices, so whatever else the two cores do weighs on
both alike. The pre-order endpoint then runs the same way behind the contenders of
bench/contenders.py (the seeds' naive design; django-idempotency-key, in a gunicorn of
its own) and behind the floor: only the round trips our design cannot do without
(first executions only; it has no replays). Last, 16-way same-key bursts count
executions for ours and for each contender. Prints a table and one JSON line; exits 1
if ours ever executes a burst twice or not at all. Usage:

    .venv/bin/python bench/idempotency_overhead.py [--seconds 8]
"""

import argparse
import http.client
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.hammer import Hammered, MakeRequest, hammer  # noqa: E402
from tests.servers import free_port, stop, wait_until_up  # noqa: E402

PG = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
DB = "ledger_bench"
REDIS = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/13")
PREORDERS, ORDERS = "/api/v1/preorders", "/api/v1/orders"
NAIVE, PACKAGE = "/bench/naive/preorders", "/bench/package/preorders"
FLOOR = "/bench/floor/preorders"
# Pre-orders issued up front, one per order the run may create.
NUMBERS = 150_000


def prepare(env: dict) -> str:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")
    manage = [str(ROOT / ".venv/bin/python"), "manage.py"]
    subprocess.run([*manage, "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    out = subprocess.run(
        [*manage, "create_customer", "bench"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    with psycopg.connect(f"{PG}/{DB}") as conn:
        conn.execute(
            "INSERT INTO orders_preorder (merchant_order_no, owner_id, created_at,"
            " expires_at) SELECT 'B' || g, u.id, now(), now() + interval '1 day'"
            " FROM generate_series(1, %s) g, auth_user u WHERE u.username = 'bench'",
            [NUMBERS],
        )
    return json.loads(out)["token"]


def preorders() -> int:
    with psycopg.connect(f"{PG}/{DB}") as conn:
        row = conn.execute("SELECT count(*) FROM orders_preorder").fetchone()
        return row[0] if row else 0


@dataclass
class Endpoint:
    """A write to drive: its path and a fresh body for each request."""

    path: str
    body: Callable[[], str]
    replays: bool = True  # the floor answers a finished key with an error

    def scenarios(self, run: str) -> dict[str, MakeRequest]:
        firsts: dict[int, tuple[str, str]] = {}  # client -> its first key and body
        serial = itertools.count()  # (request numbers restart with every slice)

        def bare(n: int, i: int) -> tuple[str, dict[str, str]]:
            return self.body(), {}

        def first(n: int, i: int) -> tuple[str, dict[str, str]]:
            key, body = f"{run}-{next(serial)}", self.body()
            firsts.setdefault(n, (key, body))
            return body, {"Idempotency-Key": key}

        def replay(n: int, i: int) -> tuple[str, dict[str, str]]:
            key, body = firsts[n]
            return body, {"Idempotency-Key": key}

        return {"bare": bare, "first": first, "replay": replay}


def endpoints() -> dict[str, Endpoint]:
    numbers = itertools.count(1)  # next() on it is atomic under the GIL

    def order() -> str:
        return json.dumps({"merchant_order_no": f"B{next(numbers)}", "amount": 100})

    return {
        "preorder": Endpoint(PREORDERS, empty),
        "order": Endpoint(ORDERS, order),
        "naive": Endpoint(NAIVE, empty),
        "floor": Endpoint(FLOOR, empty, replays=False),
    }


def empty() -> str:
    return "{}"


def measure(
    url: str, token: str, endpoint: Endpoint, clients: int, seconds: float
) -> dict[str, dict]:
    """Without and with the layer in alternating slices, then replays."""
    made = endpoint.scenarios(uuid.uuid4().hex[:8])
    hammer(url, endpoint.path, token, clients, 1.0, made["bare"])  # warm up
    rounds = 4
    totals = {"bare": Hammered(), "first": Hammered()}
    for _ in range(rounds):
        for name in totals:
            got = hammer(
                url, endpoint.path, token, clients, seconds / rounds, made[name]
            )
            totals[name] = totals[name].add(got)
    results = {name: hammered.figures() for name, hammered in totals.items()}
    if endpoint.replays:
        results["replay"] = hammer(
            url, endpoint.path, token, clients, seconds, made["replay"]
        ).figures()
    for name in results.keys() - {"bare"}:
        results[name]["vs_bare"] = round(
            results[name]["ok_rps"] / results["bare"]["ok_rps"], 3
        )
    return results


def burst(port: int, token: str, path: str, width: int) -> tuple[int, list[int]]:
    """`width` clients send one key at the same instant; return the executions (new
    pre-orders) and the answers."""
    key = f"burst-{uuid.uuid4()}"
    barrier = threading.Barrier(width)
    statuses: list[int] = []
    before = preorders()

    def one() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        headers = {
            "Authorization": f"Token {token}",
            "Content-Type": "application/json",
            "Idempotency-Key": key,
        }
        barrier.wait()
        conn.request("POST", path, "{}", headers)
        response = conn.getresponse()
        statuses.append(response.status)
        response.read()

    threads = [threading.Thread(target=one) for _ in range(width)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return preorders() - before, statuses


def bursts(port: int, token: str, path: str, rounds: int = 20) -> dict:
    """`rounds` 16-way bursts: how many ran twice or more, or not at all."""
    executions, answers = [], Counter[int]()
    for _ in range(rounds):
        executed, statuses = burst(port, token, path, 16)
        executions.append(executed)
        answers.update(statuses)
    return {
        "bursts": rounds,
        "double_executions": sum(n - 1 for n in executions if n > 1),
        "lost_executions": sum(1 for n in executions if n == 0),
        "answers": dict(sorted(answers.items())),
    }


def serve(env: dict, settings: str, workers: int) -> tuple[int, subprocess.Popen]:
    port = free_port()
    server = subprocess.Popen(
        [
            str(ROOT / ".venv/bin/gunicorn"),
            "ledger.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(workers),
        ],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": settings},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until_up(f"http://127.0.0.1:{port}", server, workers)
    except BaseException:
        stop(server)
        raise
    return port, server


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(f"stopped by signal {signum}")  # so `finally` stops gunicorn


def main() -> int:
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "DATABASE_URL": f"{PG}/{DB}",
        "REDIS_URL": REDIS,
    }
    token = prepare(env)
    results: dict[str, dict] = {}
    burst_results: dict[str, dict] = {}
    # Each server: its settings, the endpoints it is measured on, where bursts go.
    runs: list[tuple[str, dict[str, Endpoint], dict[str, str]]] = [
        ("bench.settings", endpoints(), {"ours": PREORDERS, "naive": NAIVE}),
        (
            "bench.package_settings",
            {"package": Endpoint(PACKAGE, empty)},
            {"package": PACKAGE},
        ),
    ]
    for settings, driven, burst_paths in runs:
        port, server = serve(env, settings, args.workers)
        try:
            url = f"http://127.0.0.1:{port}"
            for name, endpoint in driven.items():
                for clients in (8, 32):
                    measured = measure(url, token, endpoint, clients, args.seconds)
                    results[f"{name}_{clients}"] = measured
            for name, path in burst_paths.items():
                burst_results[name] = bursts(port, token, path)
        finally:
            stop(server)

    header = ("endpoint", "clients", "scenario", "ok/s", "p50 ms", "p99 ms", "vs bare")
    print("{:<10}{:>8}  {:<10}{:>9}{:>9}{:>9}{:>9}{:>8}".format(*header, "errors"))
    for run, measured in results.items():
        name, width = run.rsplit("_", 1)
        for scenario, r in measured.items():
            print(
                f"{name:<10}{width:>8}  {scenario:<10}{r['ok_rps']:>9}{r['p50_ms']:>9}"
                f"{r['p99_ms']:>9}{r.get('vs_bare', ''):>9}{r['errors']:>8}"
                + (f"  {r['unexpected']}" if r["errors"] else "")
            )
    for name, b in burst_results.items():
        print(
            f"16-way same-key bursts, {name}: {b['bursts']}, double executions: "
            f"{b['double_executions']}, lost: {b['lost_executions']}, "
            f"answers: {b['answers']}"
        )
    ours = burst_results["ours"]
    summary = {
        "double_executions": ours["double_executions"],
        "lost_executions": ours["lost_executions"],
        "errors": sum(
            r["errors"]
            for run, m in results.items()
            if run.startswith(("preorder", "order"))
            for r in m.values()
        ),
    }
    print(json.dumps({**summary, "results": results, "bursts": burst_results}))
    failed = summary["double_executions"] or summary["lost_executions"]
    return 1 if failed or summary["errors"] or set(ours["answers"]) - {201, 409} else 0


if __name__ == "__main__":
    sys.exit(main())
