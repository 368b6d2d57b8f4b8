"""Where does a write request's time go? Profile the hot path in one process.

Runs each write through the whole Django stack (every middleware, DRF, the
idempotency layer, the services) with Django's test client, on PostgreSQL and Redis,
so no network client or server process blurs the figures. For each scenario it prints
the CPU time per request (the median of five rounds in which the scenarios take turns)
and the SQL statements per request; then it samples one scenario with
pyinstrument and prints the call tree, so a slow frame has a name. Usage:

    .venv/bin/python bench/profile_requests.py [--requests 500] [--tree pay-first]

Scenarios: each write endpoint without the layer (`-bare`: no key; the benchmark
settings make the key optional) and as a first execution (`-first`: a new key each):
a pre-order, an order, a payment from the balance; and a pre-order replayed
(`preorder-replay`); a transfer and a batch of 100 transfers to 100 customers
(`transfer-first`, `transfer-batch-first`: a batch must cost at most 5 times one
transfer, and the last line says what it does). What it found and what was removed
is in the README ("Where the time goes").
"""

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PG = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
DB = os.environ.get("PROFILE_DB", "ledger_profile")  # dropped and created per run
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
os.environ["DATABASE_URL"] = f"{PG}/{DB}"
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/9")


ROUNDS = 5
SCENARIOS = (
    "preorder-bare",
    "preorder-first",
    "preorder-replay",
    "order-bare",
    "order-first",
    "pay-bare",
    "pay-first",
    "transfer-first",
    "transfer-batch-first",
)


@dataclass
class Scenario:
    """`send(arg)` makes one request; `prepare(i)` makes request i's argument (a fresh
    key, a pre-order number, an order to pay) before the clock starts."""

    send: Callable[[str], object]
    prepare: Callable[[int], str]


def fresh_database() -> None:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")


def scenarios() -> dict[str, Scenario]:
    from django.core.management import call_command
    from django.test import Client

    from idempotency.redis import get_redis
    from ledger.services import customer_get_or_create, ledger_deposit, merchant_account
    from orders.services import order_create, preorder_create

    call_command("migrate", verbosity=0)
    redis = get_redis()
    if redis is not None:
        redis.flushdb()
    user, token, wallet = customer_get_or_create(username="profile", currency="CNY")
    ledger_deposit(account_id=wallet.pk, amount=10**12, reference="profile:funds")
    merchant_account(currency="CNY")
    client = Client(HTTP_AUTHORIZATION=f"Token {token}")
    run = uuid.uuid4().hex[:8]

    def post(path: str, body: str, key: str | None = None) -> object:
        headers = {"Idempotency-Key": key} if key else {}
        response = client.post(
            path, body, content_type="application/json", headers=headers
        )
        if response.status_code != 201:
            raise SystemExit(f"{path} answered {response.status_code}: {response}")
        return response

    def number(i: int) -> str:
        return preorder_create(owner=user).merchant_order_no

    def order(i: int) -> str:
        placed = order_create(
            owner=user, merchant_order_no=number(i), amount=100, currency="CNY"
        )
        return placed.merchant_order_no

    def order_body(number: str) -> str:
        return (
            f'{{"merchant_order_no": "{number}", "amount": 100, '
            '"currency": "CNY", "description": "Tea"}'
        )

    recipients = [f"profile-r{n}" for n in range(100)]
    for name in recipients:
        customer_get_or_create(username=name, currency="CNY")
    one = '{"to": "profile-r0", "amount": 1, "currency": "CNY"}'
    batch = json.dumps(
        {"transfers": [{"to": n, "amount": 1, "currency": "CNY"} for n in recipients]}
    )

    preorders, orders = "/api/v1/preorders", "/api/v1/orders"
    post(preorders, "{}", f"{run}-replayed")
    return {
        "preorder-bare": Scenario(lambda _: post(preorders, "{}"), str),
        "preorder-first": Scenario(
            lambda key: post(preorders, "{}", key), lambda i: f"{run}-p{i}"
        ),
        "preorder-replay": Scenario(
            lambda key: post(preorders, "{}", key), lambda i: f"{run}-replayed"
        ),
        "order-bare": Scenario(lambda no: post(orders, order_body(no)), number),
        "order-first": Scenario(
            lambda no: post(orders, order_body(no), f"{run}-o{no}"), number
        ),
        "pay-bare": Scenario(
            lambda no: post(f"{orders}/{no}/pay", '{"method": "balance"}'), order
        ),
        "pay-first": Scenario(
            lambda no: post(
                f"{orders}/{no}/pay", '{"method": "balance"}', f"{run}-pay{no}"
            ),
            order,
        ),
        "transfer-first": Scenario(
            lambda key: post("/api/v1/transfers", one, key), lambda i: f"{run}-t{i}"
        ),
        "transfer-batch-first": Scenario(
            lambda key: post("/api/v1/transfers", batch, key), lambda i: f"{run}-b{i}"
        ),
    }


def measure(scenario: Scenario, count: int, first: int) -> tuple[float, int]:
    """CPU ms per request over `count` requests (their arguments numbered from
    `first`), and one request's SQL statements."""
    from django.db import connection, reset_queries
    from django.test.utils import CaptureQueriesContext

    arguments = [scenario.prepare(first + i) for i in range(count + 2)]
    scenario.send(arguments.pop())  # warm up: imports, caches, connections
    reset_queries()  # (each request resets the log; start the count at zero)
    with CaptureQueriesContext(connection) as captured:
        scenario.send(arguments.pop())
    statements = len(captured.captured_queries)  # now: later requests reset the log
    started = time.process_time()
    for argument in arguments:
        scenario.send(argument)
    return (time.process_time() - started) * 1000 / count, statements


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument(
        "--tree", default="pay-first", choices=SCENARIOS, help="the scenario to sample"
    )
    args = parser.parse_args()
    fresh_database()
    import django

    django.setup()
    from pyinstrument import Profiler

    found = scenarios()
    if tuple(found) != SCENARIOS:
        raise SystemExit(f"SCENARIOS is stale: {tuple(found)}")
    print(
        f"{'scenario':<20}{'CPU ms/request':>16}{'SQL statements':>16}{'bare/it':>10}"
    )
    # The scenarios take turns in rounds, and each reports its median round, so that
    # a slow moment of this shared machine does not land on one scenario alone.
    rounds: dict[str, list[float]] = {name: [] for name in found}
    statements: dict[str, int] = {}
    for round_ in range(ROUNDS):
        for name, scenario in found.items():
            count = args.requests // ROUNDS
            cpu, statements[name] = measure(scenario, count, round_ * (count + 2))
            rounds[name].append(cpu)
    cpu_of = {name: statistics.median(cpus) for name, cpus in rounds.items()}
    for name, cpu in cpu_of.items():
        # Without the layer over with it: the throughput ratio when CPU-bound.
        bare = cpu_of.get(name.rsplit("-", 1)[0] + "-bare", cpu)
        print(f"{name:<20}{cpu:>16.3f}{statements[name]:>16}{bare / cpu:>10.2f}")
    batch_cost = cpu_of["transfer-batch-first"] / cpu_of["transfer-first"]
    print(f"a batch of 100 transfers costs {batch_cost:.2f}x one transfer (at most 5)")
    sampled = found[args.tree]
    arguments = [sampled.prepare(10**6 + i) for i in range(args.requests)]
    profiler = Profiler(interval=0.0005)
    with profiler:
        for argument in arguments:
            sampled.send(argument)
    print(f"\npyinstrument, {args.requests} requests of '{args.tree}':")
    print(profiler.output_text(unicode=True, color=False, show_all=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
