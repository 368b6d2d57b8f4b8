"""What does the idempotency layer cost, what does a replay save, how does it compare
with the other ways to do it, and how does it hold up as data and load grow?

Starts its own processes (bench/stack.py): a redis-server for the locks and the
replay cache and one for the Celery broker, gunicorn (4 sync workers; `--threads`)
and a real Celery worker, on a PostgreSQL database of its own (`bench_idem_<pid>`,
created and dropped by the run; the benchmark settings make the key optional on the
write endpoints). Then, in one run:

1. Peers: the pre-order (the smallest write there is, one autocommit INSERT) without
   the layer, and first executions and replays with ours, with the seeds' naive
   design, with AWS Lambda Powertools' idempotency utility and behind the floor
   (only the round trips our corrected design cannot do without; no replays), all
   taking turns in slices at 8 and 32 clients. django-idempotency-key the same
   way, in a gunicorn of its own.
2. Order creation and a balance payment (the endpoint users pay through; each
   request pays a fresh order of its own, pre-created, from one of 32 funded
   wallets), without the layer, first executions and replays, taking turns.
3. Bursts (16 concurrent requests with one key) and a crash (the worker SIGKILLed
   the moment the effect commits, then the key retried until it is answered) for
   every design.
4. One hot merchant: payments to one merchant account, to the same merchant with its
   credits spread over 8 sub-accounts (`MERCHANT_SUB_ACCOUNTS`), and the same
   payments spread over 32 merchants, at 32 clients.
5. Housekeeping: a million expired keys purged by the project's own task on the real
   Celery worker while writers run at 32 clients, taking turns with the writers
   alone; their p99 with the purge against without it.
6. Growth: the key table bulk-loaded to 10 thousand, 1 million and 10 million
   records; at each size a first execution, a replay (from Redis) and a replay from
   the database (Redis emptied first) at one client, and the key lookup's own time
   from EXPLAIN (ANALYZE, BUFFERS).
7. Memory: the RSS of each gunicorn worker and Celery pool process after the run.

Prints the tables, then one JSON line. Exits 1 if ours executes a burst or a crashed
request twice or not at all, or answers ours' requests with anything unexpected.

    .venv/bin/python bench/idempotency_overhead.py [--seconds 8]
        [--growth 10000,1000000,10000000] [--purge-keys 1000000]
    .venv/bin/python bench/idempotency_overhead.py --quick   # tiny, for a smoke test
"""

import argparse
import http.client
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import bulk  # noqa: E402
from bench.hammer import Hammered, MakeRequest, hammer  # noqa: E402
from bench.stack import BIN, PG, Stack  # noqa: E402
from tests.servers import free_port, stop  # noqa: E402

PURGE_TASK = "idempotency.tasks.purge_expired_keys"

PREORDERS, ORDERS = "/api/v1/preorders", "/api/v1/orders"
PEERS = {  # the pre-order endpoint behind each design on the main server
    "ours": PREORDERS,
    "naive": "/api/v1/bench/naive/preorders",
    "floor": "/api/v1/bench/floor/preorders",
    "powertools": "/api/v1/bench/powertools/preorders",
}
PACKAGE = "/api/v1/bench/package/preorders"
# Powertools' records on this path expire after POWERTOOLS_CRASH_EXPIRY_SECONDS.
POWERTOOLS_CRASH = "/api/v1/bench/powertools-expiring/preorders"
LEASE_SECONDS = 3  # ours: how long a crashed request's Redis lock holds its key
POWERTOOLS_CRASH_EXPIRY_SECONDS = 2  # (contenders.py; this process has no Django)
PAYERS = 32  # funded wallets, and merchants for the spread
CLIENTS = (8, 32)
# (middleware.py)
MERCHANT_HEADER, CRASH_HEADER = "X-Bench-Merchant", "X-Bench-Crash"
SUB_ACCOUNTS_HEADER, BENCH_SUB_ACCOUNTS = "X-Bench-Sub-Accounts", 8


_began = time.monotonic()


def progress(what: str) -> None:
    print(f"[{time.monotonic() - _began:6.0f} s] {what}", flush=True)


def options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, ~1 min")
    parser.add_argument("--seconds", type=float, help="per scenario (default 8)")
    parser.add_argument("--rounds", type=int, help="slices of taking turns (8)")
    parser.add_argument(
        "--growth", help="key table sizes (default 10000,1000000,10000000)"
    )
    parser.add_argument("--purge-keys", type=int, help="default 1000000")
    parser.add_argument("--bursts", type=int, help="per design (default 20)")
    parser.add_argument("--probes", type=int, help="EXPLAINed lookups per size")
    parser.add_argument("--workers", type=int, default=4, help="gunicorn workers")
    parser.add_argument(
        "--threads", type=int, default=1, help="a worker's (1: sync; compose's web: 4)"
    )
    parser.add_argument("--workdir", help="logs (default: a temporary directory)")
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = {
        "seconds": 0.3 if quick else 8.0,
        "rounds": 1 if quick else 8,
        "growth": "1000,3000,10000" if quick else "10000,1000000,10000000",
        "purge_keys": 5000 if quick else 1_000_000,
        "bursts": 2 if quick else 20,
        "probes": 20 if quick else 200,
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.growth = [int(size) for size in args.growth.split(",")]
    return args


# -- the requests ------------------------------------------------------------------

Sent = tuple[str, dict[str, str], str]  # body, headers of its own, path
Make = Callable[[int, int], Sent]  # a MakeRequest (bench/hammer.py) that names paths


@dataclass
class Endpoint:
    """A write to drive: `next_request()` gives a fresh one (its body, any headers of
    its own, such as the Authorization of the customer whose order it pays, and
    its path)."""

    next_request: Callable[[], Sent]

    def scenarios(self, run: str) -> dict[str, Make]:
        """Without the layer (no key), first executions (a new key each) and replays
        (each client its first key again)."""
        firsts: dict[int, Sent] = {}
        serial = itertools.count()  # next() on it is atomic under the GIL

        def bare(n: int, i: int) -> Sent:
            return self.next_request()

        def first(n: int, i: int) -> Sent:
            body, headers, path = self.next_request()
            sent = (body, {**headers, "Idempotency-Key": f"{run}-{next(serial)}"}, path)
            firsts.setdefault(n, sent)
            return sent

        def replay(n: int, i: int) -> Sent:
            # (a client that made no first request in its slice takes another's)
            return firsts[n] if n in firsts else next(iter(firsts.values()))

        return {"bare": bare, "first": first, "replay": replay}


def fixed(path: str, body: str = "{}") -> Endpoint:
    return Endpoint(lambda: (body, {}, path))


def prepared(made: list[Sent], what: str) -> Endpoint:
    """Each request once, in order, from rows made before the clock started."""
    pool = iter(made)

    def next_request() -> Sent:
        try:
            return next(pool)
        except StopIteration:
            raise RuntimeError(f"ran out of prepared {what}") from None

    return Endpoint(next_request)


def with_header(make: Make, header: str, value: Callable[[int], str]) -> Make:
    """`make`'s requests, with `header` set to `value(client number)`."""

    def made(n: int, i: int) -> Sent:
        body, headers, path = make(n, i)
        return body, {**headers, header: value(n)}, path

    return made


# -- driving -----------------------------------------------------------------------


@dataclass
class Target:
    url: str
    token: str  # the default caller (every request may name its own)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


@dataclass(frozen=True)
class Pace:
    seconds: float  # each scenario, in all
    rounds: int  # slices in which scenarios that are compared take turns


def turns(
    target: Target, makers: Mapping[str, MakeRequest], clients: int, pace: Pace
) -> dict[str, dict]:
    """Each scenario for `pace.seconds` in all, taking turns in `pace.rounds` slices
    (in `makers`' order first, then each round starting one further on), so that
    whatever else the two cores do weighs on all of them alike."""
    names = list(makers)
    warm_up = makers[names[0]]
    hammer(target.url, "", target.token, clients, min(1.0, pace.seconds), warm_up)
    totals = {name: Hammered() for name in names}
    rounds: dict[str, list[float]] = {name: [] for name in names}
    slice_ = pace.seconds / pace.rounds
    for round_ in range(pace.rounds):
        turn = round_ % len(names)
        for name in names[turn:] + names[:turn]:
            got = hammer(target.url, "", target.token, clients, slice_, makers[name])
            totals[name] = totals[name].add(got)
            rounds[name].append(got.figures()["ok_rps"])
    return {
        name: {**hammered.figures(), "rounds_ok_rps": rounds[name]}
        for name, hammered in totals.items()
    }


def alone(target: Target, make: MakeRequest, clients: int, seconds: float) -> dict:
    return hammer(target.url, "", target.token, clients, seconds, make).figures()


def ratio_of(a: float, b: float) -> float:
    return round(a / b, 3) if b else 0.0


def ratio(a: dict, b: dict) -> float:
    """Answers per second of `a` over `b`'s: of scenarios that took turns, the median
    of the rounds' ratios. A round's slices run one after another, so a stall of the
    shared machine that spoils one slice spoils one round's ratio, not the figure, as
    it does the ratio of the totals (`pooled`), which is printed beside it."""
    per_a, per_b = a.get("rounds_ok_rps"), b.get("rounds_ok_rps")
    if per_a and per_b and len(per_a) == len(per_b) and all(per_b):
        ratios = [x / y for x, y in zip(per_a, per_b, strict=True)]
        return round(statistics.median(ratios), 3)
    return pooled(a, b)


def pooled(a: dict, b: dict) -> float:
    """Answers per second of `a` over `b`'s, over all their slices together."""
    return ratio_of(a["ok_rps"], b["ok_rps"])


def endpoint_run(
    target: Target, endpoint: Endpoint, clients: int, pace: Pace
) -> dict[str, dict]:
    """Without the layer, first executions and replays taking turns; each against
    the first."""
    figures = turns(target, endpoint.scenarios(uuid.uuid4().hex[:8]), clients, pace)
    for name in ("first", "replay"):
        figures[name]["vs_bare"] = ratio(figures[name], figures["bare"])
        figures[name]["vs_bare_pooled"] = pooled(figures[name], figures["bare"])
    return figures


def peers_run(target: Target, clients: int, pace: Pace) -> dict[str, dict]:
    """The pre-order without the layer, and first executions and replays behind
    every design on this server (the floor has no replays), all taking turns."""
    made = {
        name: fixed(path).scenarios(uuid.uuid4().hex[:8])
        for name, path in PEERS.items()
    }
    makers = {"bare": made["ours"]["bare"]}
    makers.update({f"{name} first": made[name]["first"] for name in PEERS})
    makers.update({f"{name} replay": made[name]["replay"] for name in PEERS})
    del makers["floor replay"]
    figures = turns(target, makers, clients, pace)
    bare = figures.pop("bare")
    results: dict[str, dict] = {name: {} for name in PEERS}
    results["ours"]["bare"] = bare
    for scenario, measured in figures.items():
        name, kind = scenario.split()
        results[name][kind] = {
            **measured,
            "vs_bare": ratio(measured, bare),
            "vs_bare_pooled": pooled(measured, bare),
        }
    return results


# -- bursts and crashes --------------------------------------------------------------


def preorders(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return bulk.scalar(conn, "SELECT count(*) FROM orders_preorder")


def send(
    target: Target, path: str, body: str = "{}", headers: dict | None = None
) -> int | None:
    """One POST; its status, or None when the connection dropped (a crash)."""
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=30)
    try:
        conn.request(
            "POST",
            path,
            body,
            {
                "Authorization": f"Token {target.token}",
                "Content-Type": "application/json",
                **(headers or {}),
            },
        )
        response = conn.getresponse()
        response.read()
        return response.status
    except (http.client.HTTPException, ConnectionError):
        return None
    finally:
        conn.close()


def burst(target: Target, dsn: str, path: str, width: int) -> tuple[int, list]:
    """`width` clients send one key at the same instant: the executions (new
    pre-orders) and the answers."""
    key, barrier = f"burst-{uuid.uuid4()}", threading.Barrier(width)
    statuses: list[int | None] = []

    def one() -> None:
        barrier.wait()
        statuses.append(send(target, path, headers={"Idempotency-Key": key}))

    before = preorders(dsn)
    threads = [threading.Thread(target=one) for _ in range(width)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return preorders(dsn) - before, statuses


def bursts(target: Target, dsn: str, path: str, rounds: int) -> dict:
    """`rounds` 16-way bursts: how many ran more than once, or not at all."""
    executions, answers = [], Counter[int | None]()
    for _ in range(rounds):
        executed, statuses = burst(target, dsn, path, 16)
        executions.append(executed)
        answers.update(statuses)
    return {
        "bursts": rounds,
        "double_executions": sum(n - 1 for n in executions if n > 1),
        "lost_executions": sum(1 for n in executions if n == 0),
        "answers": {str(k): v for k, v in sorted(answers.items(), key=str)},
    }


def crash(target: Target, dsn: str, path: str, wait: float) -> dict:
    """The worker is SIGKILLed the moment the request's effect commits; then the key
    is retried every 0.25 s until it is answered 201 or `wait` seconds pass."""
    key, before = f"crash-{uuid.uuid4()}", preorders(dsn)
    send(target, path, headers={"Idempotency-Key": key, CRASH_HEADER: "after-commit"})
    killed_at, answers, served_after = time.monotonic(), Counter[int | None](), None
    while time.monotonic() < killed_at + wait:
        status = send(target, path, headers={"Idempotency-Key": key})
        answers[status] += 1
        if status == 201:
            served_after = round(time.monotonic() - killed_at, 1)
            break
        time.sleep(0.25)
    executions = preorders(dsn) - before
    return {
        "executions": executions,
        "double_executions": max(0, executions - 1),
        "served_after_s": served_after,  # None: the key is still refused
        "answers": {str(k): v for k, v in sorted(answers.items(), key=str)},
    }


# -- set-up --------------------------------------------------------------------------


def start(stack: Stack, workers: int) -> list[dict]:
    """A fresh database with the payers (funded wallets) and the merchants, then the
    processes: both redis-servers, gunicorn and a Celery worker."""
    made = stack.prepare_database({f"payer{n}": 10**12 for n in range(PAYERS)})
    subprocess.run(
        [
            str(BIN / "python"),
            "manage.py",
            "shell",
            "-c",
            "from bench.middleware import merchants_create; "
            f"merchants_create({PAYERS})",
        ],
        cwd=ROOT,
        env=stack.env(),
        check=True,
    )
    stack.start_redis("broker", stack.broker_port)
    stack.cache_redis = stack.start_redis("cache", stack.cache_port)
    stack.web = stack.start_gunicorn(
        "gunicorn", stack.web_port, workers, threads=stack.web_threads
    )
    stack.start_worker()
    return [made[f"payer{n}"] for n in range(PAYERS)]


def prepare_rows(
    conn: psycopg.Connection, target: Target, payers: list[dict], seconds: float
) -> list[Sent]:
    """Before any clock starts: pre-order numbers B0.. for the default caller's
    order creations, and unpaid orders P1.. spread over the payers' wallets, one per
    payment the run may make (copies of one order made through the API); return the
    payments, interleaving the payers."""
    enough = int(500 * (4 * seconds + 2) * (len(CLIENTS) + 1))  # at 500 req/s
    owners: dict[int, int] = dict(
        conn.execute(
            "SELECT id, owner_id FROM ledger_account WHERE id = ANY(%s)",
            [[payer["account"] for payer in payers]],
        ).fetchall()
    )
    conn.execute(
        "INSERT INTO orders_preorder (merchant_order_no, owner_id, created_at,"
        " expires_at) SELECT 'B' || g, %s, now(), now() + interval '1 day'"
        " FROM generate_series(0, %s) g",
        [owners[payers[0]["account"]], enough],
    )
    body = json.dumps({"merchant_order_no": "B0", "amount": 100, "currency": "CNY"})
    if (status := send(target, ORDERS, body)) != 201:
        raise RuntimeError(f"the order to copy was answered {status}")
    template = bulk.scalar(conn, "SELECT max(id) FROM orders_order")
    ids = ", ".join(str(owners[payer["account"]]) for payer in payers)
    bulk.copy_rows(
        conn,
        "orders_order",
        template,
        enough,
        {
            "merchant_order_no": "'P' || g",
            "owner_id": f"(ARRAY[{ids}])[g %% {len(payers)} + 1]",
        },
    )
    return [
        (
            '{"method": "balance"}',
            {"Authorization": f"Token {payers[g % len(payers)]['token']}"},
            f"{ORDERS}/P{g}/pay",
        )
        for g in range(1, enough + 1)
    ]


def order_endpoint() -> Endpoint:
    numbers = itertools.count(1)  # B0 went to the order that is copied

    def next_request() -> Sent:
        body = {"merchant_order_no": f"B{next(numbers)}", "amount": 100}
        return json.dumps(body), {}, ORDERS

    return Endpoint(next_request)


# -- the hot merchant, the purge, growth, memory ---------------------------------------


def hot_merchant_run(
    conn: psycopg.Connection, target: Target, pay: Endpoint, pace: Pace
) -> dict:
    """Payments at 32 clients, all to one merchant account, to the same merchant
    spread over its sub-accounts (`MERCHANT_SUB_ACCOUNTS`), or each client's to its
    own of 32 merchants, taking turns."""
    first = pay.scenarios(uuid.uuid4().hex[:8])["first"]
    hot = with_header(first, MERCHANT_HEADER, lambda n: "0")
    figures = turns(
        target,
        {
            "spread": with_header(first, MERCHANT_HEADER, lambda n: str(n % PAYERS)),
            "hot": hot,
            "hot_sub_accounts": with_header(
                hot, SUB_ACCOUNTS_HEADER, lambda n: str(BENCH_SUB_ACCOUNTS)
            ),
        },
        32,
        pace,
    )
    # (the sub-accounts' slice landed on them: merchant 0's that took payments,
    # whether beat's sweep has moved the money up since or not)
    (used,) = conn.execute(
        "SELECT count(DISTINCT a.id) FROM ledger_account a"
        " JOIN ledger_posting p ON p.account_id = a.id AND p.amount > 0"
        " WHERE a.code LIKE 'merchant-cny-0-sub-%'"
    ).fetchone() or (0,)
    return {
        **figures,
        "ratio": ratio(figures["hot"], figures["spread"]),
        "sub_accounts_ratio": ratio(figures["hot_sub_accounts"], figures["spread"]),
        "ratio_pooled": pooled(figures["hot"], figures["spread"]),
        "sub_accounts_ratio_pooled": pooled(
            figures["hot_sub_accounts"], figures["spread"]
        ),
        "sub_accounts_used": used,
    }


def purge_run(
    stack: Stack, conn: psycopg.Connection, target: Target, keys: int, seconds: float
) -> dict:
    """`keys` expired key records, purged by the project's task on the Celery worker
    while writers make first executions at 32 clients: their p99 with the purge
    running against without it, and after it (when autovacuum cleans up what it
    deleted).

    With and without take turns until the purge is done: the writers alone for
    `seconds / 4`, then the task sent with `max_seconds = seconds / 2` and the
    writers running while it works. A p99 is the slowest 1 % of the requests; taken
    from one stretch before the purge and another during it, it also measured how
    the machine drifted in between (checkpoints, autovacuum, the other processes on
    the two cores): over 8 s it moved by half from one run to the next, as much as
    the purge itself. Taking turns, the drift weighs on both alike."""
    from celery import Celery

    loaded_in = bulk.load_keys(conn, keys, expired=True)
    writers = fixed(PREORDERS).scenarios(uuid.uuid4().hex[:8])["first"]
    broker = stack.env()["CELERY_BROKER_URL"]
    app = Celery(broker=broker, backend=broker)
    working, resting = seconds / 2, seconds / 4
    alone(target, writers, 32, 1.0)  # (warm-up)
    without, during = Hammered(), Hammered()
    runs: list[int] = []  # what each run of the task deleted
    took = 0.0  # the seconds the task worked, in all (from sending to its answer)
    waiting = ThreadPoolExecutor(1)
    try:
        while not runs or runs[-1]:
            got = hammer(target.url, "", target.token, 32, resting, writers)
            without = without.add(got)
            started = time.monotonic()
            sent = app.send_task(PURGE_TASK, kwargs={"max_seconds": working})
            # (its answer waited for beside the writers: when it comes, the task
            # stopped working)
            answer = waiting.submit(answered, sent)
            got = hammer(target.url, "", target.token, 32, working, writers)
            found, ended = answer.result()
            took += ended - started
            runs.append(found)
            if found:  # (the last run finds nothing: the writers were alone)
                during = during.add(got)
    except Exception as exc:
        raise RuntimeError(f"the purge task failed: {exc!r}") from exc
    finally:
        waiting.shutdown()
        app.close()
    after = alone(target, writers, 32, seconds / 2)
    busy, calm = during.figures(), without.figures()
    return {
        "keys": sum(runs),
        "task_runs": len(runs),
        "load_s": round(loaded_in, 1),
        "purge_s": round(took, 1),
        "keys_per_s": round(sum(runs) / took) if took else 0,
        "without": calm,
        "during": busy,
        "after": after,
        "p99_ratio": ratio_of(busy["p99_ms"], calm["p99_ms"]),
    }


def answered(sent: Any) -> tuple[int, float]:
    """A sent task's answer, and when it came."""
    return sent.get(timeout=600), time.monotonic()


def emptying(cache: redis.Redis, make: Make) -> Make:
    """`make`'s requests, each after Redis lost everything (before the clock)."""

    def made(n: int, i: int) -> Sent:
        cache.flushdb()
        return make(n, i)

    return made


def growth_run(
    conn: psycopg.Connection,
    target: Target,
    cache: redis.Redis,
    sizes: list[int],
    seconds: float,
    probes: int,
) -> dict[str, dict]:
    """The key table emptied, then loaded to each size in turn; at each, one client
    makes first executions, replays from Redis and replays from the database, and
    the key lookup is EXPLAINed."""
    conn.execute(f"TRUNCATE {bulk.KEYS}")
    send(target, PREORDERS, headers={"Idempotency-Key": f"template-{uuid.uuid4()}"})
    grown: dict[str, dict] = {}
    for size in sizes:
        progress(f"the key table at {size} records")
        missing = size - bulk.key_records(conn)
        loaded_in = bulk.load_keys(conn, missing) if missing > 0 else 0.0
        made = fixed(PREORDERS).scenarios(uuid.uuid4().hex[:8])
        first = alone(target, made["first"], 1, seconds)
        replay = alone(target, made["replay"], 1, seconds)
        from_db = alone(target, emptying(cache, made["replay"]), 1, seconds)
        grown[str(size)] = {
            "records": bulk.key_records(conn),
            "load_s": round(loaded_in, 1),
            "first_ms": first["p50_ms"],
            "replay_ms": replay["p50_ms"],
            "replay_db_ms": from_db["p50_ms"],
            "errors": first["errors"] + replay["errors"] + from_db["errors"],
            **bulk.lookup(conn, probes),
        }
    return grown


def rss_mb(pids: list[int]) -> float:
    """The largest resident set among `pids`, in MB."""
    sizes = []
    for pid in pids:
        status = Path(f"/proc/{pid}/status").read_text()
        sizes += [
            int(line.split()[1])
            for line in status.splitlines()
            if line.startswith("VmRSS:")
        ]
    return round(max(sizes) / 1024, 1) if sizes else 0.0


# -- the run ---------------------------------------------------------------------------


def run(stack: Stack, args: argparse.Namespace) -> dict:
    progress("database, processes")
    payers = start(stack, args.workers)
    dsn = f"{PG}/{stack.database}"
    target = Target(stack.web_url, payers[0]["token"])
    pace = Pace(args.seconds, args.rounds)
    # A crashed request's key: ours waits out the Redis lease, Powertools its record.
    wait = max(LEASE_SECONDS, POWERTOOLS_CRASH_EXPIRY_SECONDS) + 2
    out: dict = {"results": {}, "bursts": {}, "crashes": {}}
    results = out["results"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        pay = prepared(
            prepare_rows(conn, target, payers, pace.seconds), "orders to pay"
        )
        order = order_endpoint()
        for clients in CLIENTS:
            progress(f"pre-orders behind every design, {clients} clients")
            for name, figures in peers_run(target, clients, pace).items():
                results[f"{'preorder' if name == 'ours' else name}_{clients}"] = figures
            progress(f"orders and payments, {clients} clients")
            results[f"order_{clients}"] = endpoint_run(target, order, clients, pace)
            results[f"pay_{clients}"] = endpoint_run(target, pay, clients, pace)
        progress("bursts and crashes")
        crashed = {**PEERS, "powertools": POWERTOOLS_CRASH}
        for name in ("ours", "naive", "powertools"):
            out["bursts"][name] = bursts(target, dsn, PEERS[name], args.bursts)
            out["crashes"][name] = crash(target, dsn, crashed[name], wait)
        progress("one merchant or 32")
        out["hot_merchant"] = hot_merchant_run(conn, target, pay, pace)

        progress("django-idempotency-key")
        port = free_port()
        server = stack.start_gunicorn(
            "package",
            port,
            args.workers,
            settings="bench.package_settings",
            threads=args.threads,
        )
        try:
            package = Target(f"http://127.0.0.1:{port}", target.token)
            for clients in CLIENTS:
                results[f"package_{clients}"] = endpoint_run(
                    package, fixed(PACKAGE), clients, pace
                )
            out["bursts"]["package"] = bursts(package, dsn, PACKAGE, args.bursts)
            out["crashes"]["package"] = crash(package, dsn, PACKAGE, wait)
        finally:
            stop(server)

        progress(f"purge of {args.purge_keys} expired keys under load")
        out["purge"] = purge_run(stack, conn, target, args.purge_keys, args.seconds)
        cache = redis.Redis.from_url(stack.env()["REDIS_URL"])
        out["growth"] = growth_run(
            conn, target, cache, args.growth, args.seconds / 2, args.probes
        )
    out["memory"] = {
        "rss_mb_web": rss_mb(stack.web_workers_pids()),
        "rss_mb_worker": rss_mb(stack.worker_pool_pids()),
    }
    return out


def summary(out: dict) -> dict:
    """The figures issue 19 names, from the run's results."""
    results, growth = out["results"], out["growth"]
    ours_burst, ours_crash = out["bursts"]["ours"], out["crashes"]["ours"]
    figures = {
        "double_executions": ours_burst["double_executions"]
        + ours_crash["double_executions"],
        "lost_executions": ours_burst["lost_executions"]
        + (ours_crash["executions"] == 0),
        "errors": sum(
            figures["errors"]
            for run, measured in results.items()
            if run.startswith(("preorder", "order", "pay"))
            for figures in measured.values()
        ),
        "powertools_measured": int(all(f"powertools_{c}" in results for c in CLIENTS)),
        "powertools_double_executions_after_crash": out["crashes"]["powertools"][
            "double_executions"
        ],
    }
    pooled_figures = figures["pooled"] = {}  # the same ratios, of the totals
    for c in CLIENTS:
        first, floor = results[f"preorder_{c}"]["first"], results[f"floor_{c}"]["first"]
        figures[f"first_vs_floor_c{c}"] = ratio(first, floor)
        pooled_figures[f"first_vs_floor_c{c}"] = pooled(first, floor)
        for key, measured in (
            (f"replay_ratio_c{c}", results[f"preorder_{c}"]["replay"]),
            (f"pay_first_ratio_c{c}", results[f"pay_{c}"]["first"]),
            (f"powertools_first_ratio_c{c}", results[f"powertools_{c}"]["first"]),
        ):
            figures[key] = measured["vs_bare"]
            pooled_figures[key] = measured["vs_bare_pooled"]
    smallest, largest = growth[min(growth, key=int)], growth[max(growth, key=int)]
    # (the largest size over the smallest, whatever --growth named)
    figures["lookup_ms_ratio_10m_vs_10k"] = ratio_of(
        largest["new_ms"], smallest["new_ms"]
    )
    hot = out["hot_merchant"]
    figures["hot_merchant_ratio"] = hot["ratio"]
    figures["hot_merchant_sub_accounts_ratio"] = hot["sub_accounts_ratio"]
    pooled_figures["hot_merchant_ratio"] = hot["ratio_pooled"]
    pooled_figures["hot_merchant_sub_accounts_ratio"] = hot["sub_accounts_ratio_pooled"]
    figures["purge_p99_ratio"] = out["purge"]["p99_ratio"]
    figures["purge_keys_per_s"] = out["purge"]["keys_per_s"]
    figures.update(out["memory"])
    return figures


def report(out: dict, figures: dict) -> None:
    header = ("endpoint", "clients", "scenario", "ok/s", "p50 ms", "p99 ms", "vs bare")
    print(
        "{:<11}{:>8}  {:<8}{:>9}{:>9}{:>9}{:>9}{:>8}{:>8}".format(
            *header, "pooled", "errors"
        )
    )
    for run, measured in out["results"].items():
        name, width = run.rsplit("_", 1)
        for scenario, r in measured.items():
            print(
                f"{name:<11}{width:>8}  {scenario:<8}{r['ok_rps']:>9}{r['p50_ms']:>9}"
                f"{r['p99_ms']:>9}{r.get('vs_bare', ''):>9}"
                f"{r.get('vs_bare_pooled', ''):>8}{r['errors']:>8}"
                + (f"  {r['unexpected']}" if r["errors"] else "")
            )
    print()
    for name, b in out["bursts"].items():
        c = out["crashes"][name]
        served = (
            f"answered 201 after {c['served_after_s']} s"
            if c["served_after_s"] is not None
            else "still refused"
        )
        print(
            f"{name:<11} 16-way bursts: {b['bursts']}, double executions "
            f"{b['double_executions']}, lost {b['lost_executions']}, answers "
            f"{b['answers']}; killed after commit: executed {c['executions']}x, "
            f"retry {served} {c['answers']}"
        )
    hot = out["hot_merchant"]
    print(
        f"\none merchant vs 32, 32 clients: {hot['hot']['ok_rps']} vs "
        f"{hot['spread']['ok_rps']} payments/s ({hot['ratio']}x, the totals' "
        f"{hot['ratio_pooled']}x); spread over its {BENCH_SUB_ACCOUNTS} sub-accounts: "
        f"{hot['hot_sub_accounts']['ok_rps']} payments/s "
        f"({hot['sub_accounts_ratio']}x, {hot['sub_accounts_ratio_pooled']}x; "
        f"{hot['sub_accounts_used']} of them "
        "took payments)"
    )
    purge = out["purge"]
    print(
        f"purge of {purge['keys']} expired keys (loaded in {purge['load_s']} s) by "
        f"{purge['task_runs']} run(s) of the task: {purge['purge_s']} s, "
        f"{purge['keys_per_s']} keys/s; writers at 32 clients, without / during / "
        "after: "
        + ", ".join(
            f"{purge[when]['ok_rps']}/s p99 {purge[when]['p99_ms']} ms"
            for when in ("without", "during", "after")
        )
        + f" ({purge['p99_ratio']}x)"
    )
    print(
        f"\n{'key records':>12}{'load s':>8}{'first ms':>10}{'replay ms':>10}"
        f"{'db replay':>10}{'lookup new':>11}{'lookup known':>13}{'buffers':>10}"
    )
    for g in out["growth"].values():
        buffers = f"{g['new_hit']:g}/{g['new_read']:g}"
        print(
            f"{g['records']:>12}{g['load_s']:>8}{g['first_ms']:>10}{g['replay_ms']:>10}"
            f"{g['replay_db_ms']:>10}{g['new_ms']:>11}{g['known_ms']:>13}{buffers:>10}"
        )
    memory = out["memory"]
    print(
        f"\nRSS: gunicorn worker {memory['rss_mb_web']} MB, Celery pool process "
        f"{memory['rss_mb_worker']} MB"
    )
    print(json.dumps({**figures, **out}))


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(f"stopped by signal {signum}")  # so `finally` stops everything


def drop_database(name: str) -> None:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    args = options(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-idempotency-"))
    workdir.mkdir(parents=True, exist_ok=True)
    progress(f"work directory: {workdir}")
    stack = Stack(
        workdir,
        web_workers=args.workers,
        web_threads=args.threads,
        lease_seconds=LEASE_SECONDS,
        settings="bench.settings",
        database=f"bench_idem_{os.getpid()}",  # never another run's
    )
    try:
        out = run(stack, args)
    finally:
        stack.close()
        drop_database(stack.database)
    figures = summary(out)
    report(out, figures)
    answers = set(out["bursts"]["ours"]["answers"]) - {"201", "409"}
    failed = figures["double_executions"] or figures["lost_executions"]
    return 1 if failed or figures["errors"] or answers else 0


if __name__ == "__main__":
    sys.exit(main())
