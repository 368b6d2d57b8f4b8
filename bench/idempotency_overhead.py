"""What does the idempotency layer cost, and what does a replay save?

Starts gunicorn (4 sync workers) on PostgreSQL + Redis on this machine, then drives the
same small write endpoint
  * without the layer (no Idempotency-Key),
  * with it, every request a first execution (a new key each),
  * with it, every request a replay of a finished key (served from Redis),
at 8 and 32 concurrent keep-alive clients, and fires 16-way same-key bursts to count
double executions. Prints a table and one JSON line. Usage:

    .venv/bin/python bench/idempotency_overhead.py [--seconds 8]
"""

import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.hammer import hammer  # noqa: E402
from tests.servers import free_port, stop, wait_until_up  # noqa: E402

PG = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
DB = "ledger_bench"
REDIS = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/13")
PATH = "/bench/preorders"


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
    return json.loads(out)["token"]


def preorders() -> int:
    with psycopg.connect(f"{PG}/{DB}") as conn:
        row = conn.execute("SELECT count(*) FROM orders_preorder").fetchone()
        return row[0] if row else 0


def burst(port, token, width: int) -> int:
    """`width` clients send one key at the same instant; return executions."""
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
        conn.request("POST", PATH, "{}", headers)
        response = conn.getresponse()
        statuses.append(response.status)
        response.read()

    threads = [threading.Thread(target=one) for _ in range(width)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not set(statuses) <= {201, 409}:
        raise SystemExit(f"unexpected answers in a burst: {statuses}")
    return preorders() - before


def main() -> int:
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
    port = free_port()
    server = subprocess.Popen(
        [
            str(ROOT / ".venv/bin/gunicorn"),
            "ledger.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(args.workers),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url, server, args.workers)
        run = uuid.uuid4().hex[:8]
        results: dict[str, dict] = {}
        for clients in (8, 32):

            def bare(n, i):
                return "{}", {}

            def first(n, i, c=clients):
                key = f"{run}-f{c}-{n}-{i}"
                return "{}", {"Idempotency-Key": key}

            def replay(n, i, c=clients):
                key = f"{run}-f{c}-{n}-0"  # the first key this client finished
                return "{}", {"Idempotency-Key": key}

            hammer(url, PATH, token, clients, 1.0, bare)  # warm up every worker
            for name, make in (("bare", bare), ("first", first), ("replay", replay)):
                hammered = hammer(url, PATH, token, clients, args.seconds, make)
                results[f"{name}_{clients}"] = hammered.figures()
        bursts = [burst(port, token, 16) for _ in range(20)]
    finally:
        stop(server)

    print(f"{'scenario':<12}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'errors':>8}")
    for name, r in results.items():
        print(
            f"{name:<12}{r['rps']:>10}{r['p50_ms']:>10}{r['p99_ms']:>10}"
            f"{r['errors']:>8}"
        )
    summary = {
        "first_over_bare_8": round(
            results["first_8"]["rps"] / results["bare_8"]["rps"], 3
        ),
        "first_over_bare_32": round(
            results["first_32"]["rps"] / results["bare_32"]["rps"], 3
        ),
        "replay_over_bare_8": round(
            results["replay_8"]["rps"] / results["bare_8"]["rps"], 3
        ),
        "replay_over_bare_32": round(
            results["replay_32"]["rps"] / results["bare_32"]["rps"], 3
        ),
        "bursts": len(bursts),
        "double_executions": sum(count - 1 for count in bursts if count > 1),
        "lost_executions": sum(1 for count in bursts if count == 0),
    }
    print(
        f"first/bare: {summary['first_over_bare_8']} (8 clients), "
        f"{summary['first_over_bare_32']} (32); replay/bare: "
        f"{summary['replay_over_bare_8']} (8), {summary['replay_over_bare_32']} (32); "
        f"16-way same-key bursts: {summary['bursts']}, double executions: "
        f"{summary['double_executions']}"
    )
    print(json.dumps({**summary, "results": results}))
    return 1 if summary["double_executions"] or summary["lost_executions"] else 0


if __name__ == "__main__":
    sys.exit(main())
