"""Proof under fire: drive the real stack with retrying agents, break it, audit it.

    .venv/bin/python bench/load.py            # make bench: load, no chaos
    .venv/bin/python bench/load.py --chaos    # make chaos: load and chaos
    .venv/bin/python bench/load.py --chaos --short   # about a minute, in make test

The run, start to end (nothing is mocked; see bench/stack.py for the processes):

1. A fresh PostgreSQL database, customers with opening balances, two redis-servers of
   our own, gunicorn (4 workers), the provider simulator (the app's own, in a second
   gunicorn, delivering every callback twice on purpose, through the proxy), a Celery
   worker and Celery beat, and a TCP proxy (bench/proxy.py) between the agents and
   gunicorn.
2. Overhead: the same endpoint (POST /api/v1/preorders, whose key is optional)
   without the idempotency layer and with it, from 8 clients straight to gunicorn.
3. Load: `--clients` agent processes (bench/agent.py, the shipped IdempotentClient)
   each run intents (pre-order, order, pay with the balance or the provider, confirm
   on the pay page; every fourth intent a transfer to the next agent's customer) for
   `--seconds`; every step is retried `--retries` times with its
   key, sometimes twice at the same instant. Some agents are SIGKILLed after a pay
   request's reply arrived and before they read it, then started again on the same
   intents.
4. Chaos (`--chaos`), during the load: SIGKILL gunicorn workers (ours and the
   provider's), Celery pool processes and the whole Celery worker, restart the
   cache's redis-server, SIGKILL agents at random moments, cut replies in the proxy.
5. Settle: chaos off; agents restarted on every intent still without a final answer;
   wait (bounded) for keys, callbacks, provider payments and shipments to finish.
6. Verdict (bench/verdict.py) from the database, a table, and one JSON line. The exit
   status is 1 on any violation.
"""

import argparse
import json
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.hammer import Hammered, hammer
from bench.proxy import CuttingProxy
from bench.stack import BIN, DB, PG, ROOT, Stack, kill_group
from bench.verdict import (
    Intent,
    check_ledger,
    database_facts,
    judge,
    pending_work,
)

LEASE_SECONDS = 5


def options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chaos", action="store_true", help="break things too")
    parser.add_argument("--short", action="store_true", help="about 60 s in all")
    parser.add_argument("--clients", type=int, help="agent processes")
    parser.add_argument("--intents", type=int, help="intents per agent at most")
    parser.add_argument("--seconds", type=float, help="load duration")
    parser.add_argument("--retries", type=int, default=2, help="per step, same key")
    parser.add_argument("--web-workers", type=int, default=4)
    # (compose's web: 4 workers of 4 threads)
    parser.add_argument("--web-threads", type=int, default=4, help="per worker")
    parser.add_argument("--overhead-seconds", type=float, help="per scenario")
    parser.add_argument("--settle-seconds", type=float, help="bounded final wait")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--workdir", help="logs and stores (default: a temp dir)")
    args = parser.parse_args(argv)
    short = args.short
    defaults = {
        "clients": 3 if short else 8,
        "intents": 200,
        "seconds": 25.0 if short else 120.0,
        "overhead_seconds": 3.0 if short else 8.0,
        # Long enough for the slowest recovery the stack owns: a callback whose
        # task was lost waits for `redrive_inbox` (every 60 s, for events older than
        # 60 s), and for a new acting beat (BEAT_LEASE_SECONDS, 30) if the beat died.
        # The settle returns as soon as nothing is owed, so a calm run is no longer.
        "settle_seconds": 150.0,
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(10**6)
    return args


# -- overhead: the same endpoint with and without the layer ---------------------


def overhead(url: str, token: str, seconds: float, rounds: int = 4) -> dict:
    """`seconds` of each scenario, without and with the layer, in alternating
    slices so that whatever else the machine does weighs on both alike."""

    def bare(n: int, i: int) -> tuple[str, dict[str, str]]:
        return "{}", {}

    def keyed(n: int, i: int) -> tuple[str, dict[str, str]]:
        return "{}", {"Idempotency-Key": f"overhead-{uuid.uuid4().hex}"}

    path = "/api/v1/preorders"
    hammer(url, path, token, 8, 0.5, bare)  # warm every worker up
    totals = {"bare": Hammered(), "keyed": Hammered()}
    for _ in range(rounds):
        for name, make in (("bare", bare), ("keyed", keyed)):
            slice_ = hammer(url, path, token, 8, seconds / rounds, make)
            totals[name] = totals[name].add(slice_)
    result: dict = {name: hammered.figures() for name, hammered in totals.items()}
    bare_rps, keyed_rps = result["bare"]["rps"], result["keyed"]["rps"]
    result["ratio"] = round(keyed_rps / bare_rps, 3) if bare_rps else 0.0
    return result


# -- the agents ----------------------------------------------------------------


@dataclass
class AgentRun:
    """One agent process and where it stands."""

    name: str
    customer: dict
    store: Path
    doomed: set[int]
    process: subprocess.Popen | None = None
    peer: str = ""  # the customer its transfer intents send money to
    current: int = 0  # the intent number it is working on
    starts: int = 0
    exited: bool = False


@dataclass
class Tally:
    requests: list[tuple[str, int, float, bool]] = field(default_factory=list)
    kills: Counter[str] = field(default_factory=Counter)
    agent_errors: list[str] = field(default_factory=list)


class Load:
    """The agents, the chaos and the bookkeeping of everything they report."""

    def __init__(
        self,
        args: argparse.Namespace,
        stack: Stack,
        proxy: CuttingProxy,
        chaos: "type[Chaos] | None" = None,
    ):
        self.args, self.stack, self.proxy = args, stack, proxy
        self.chaos = chaos or Chaos
        self.chaos_run: Chaos | None = None
        self.rng = random.Random(args.seed)
        self.events: queue.Queue[tuple[AgentRun, dict]] = queue.Queue()
        self.intents: dict[str, Intent] = {}
        self.tally = Tally()
        self.agents: list[AgentRun] = []
        self.until = 0.0

    # -- agent processes

    def spawn_agent(self, agent: AgentRun, *, only: list[int] | None = None) -> None:
        argv = [
            str(BIN / "python"),
            "bench/agent.py",
            "--url",
            self.proxy.url,
            "--token",
            agent.customer["token"],
            "--store",
            str(agent.store),
            "--agent",
            agent.name,
            "--retries",
            str(self.args.retries),
            "--peer",
            agent.peer,
        ]
        if only is not None:
            argv += ["--only", ",".join(map(str, only))]
        else:
            argv += ["--first", str(agent.current), "--until", str(self.until)]
            remaining = self.args.intents - agent.current
            argv += ["--count", str(max(remaining, 1))]
            doom = sorted(n for n in agent.doomed if n >= agent.current)
            argv += ["--doom", ",".join(f"{agent.name}-{n}" for n in doom)]
        agent.process = self.stack.spawn(
            f"agent-{agent.name}",
            argv,
            stdout=subprocess.PIPE,
            stderr=(self.stack.workdir / f"agent-{agent.name}.err").open("a"),
            stdin=subprocess.PIPE,
            text=True,
        )
        agent.starts += 1
        agent.exited = False
        threading.Thread(
            target=self._read, args=(agent, agent.process), daemon=True
        ).start()

    def _read(self, agent: AgentRun, process: subprocess.Popen) -> None:
        if process.stdout is None:
            return
        journal = (self.stack.workdir / f"agent-{agent.name}.events").open("a")
        for line in process.stdout:
            journal.write(line)
            try:
                self.events.put((agent, json.loads(line)))
            except ValueError:
                continue
        journal.close()
        process.wait()
        # Named by pid: a killed agent's end may arrive after its successor started.
        ended = {"ev": "ended", "pid": process.pid, "returncode": process.returncode}
        self.events.put((agent, ended))

    def kill_agent(self, agent: AgentRun, reason: str) -> None:
        """SIGKILL the agent and start it again on the intent it was working on."""
        if agent.process is None or agent.process.poll() is not None:
            return
        kill_group(agent.process)
        self.tally.kills[reason] += 1

    # -- events

    def handle(self, agent: AgentRun, event: dict) -> None:
        kind = event["ev"]
        if kind == "ended":  # finished, killed or crashed
            if event["returncode"] not in (0, -9):
                self.tally.agent_errors.append(
                    f"agent {agent.name} exited {event['returncode']}"
                )
            if agent.process is not None and agent.process.pid == event["pid"]:
                agent.exited = True
            return
        if kind == "req":
            self.tally.requests.append(
                (
                    event["step"],
                    event["status"],
                    event["ms"],
                    event.get("replayed", False),
                )
            )
            if event.get("intent"):
                self.intents.setdefault(
                    event["intent"],
                    Intent(name=event["intent"], customer=agent.customer["username"]),
                ).attempts[f"{event['step']} {event['status']}"] += 1
            return
        if kind == "exit":
            return
        intent = self.intents.setdefault(
            event["intent"],
            Intent(name=event["intent"], customer=agent.customer["username"]),
        )
        if kind == "start":
            intent.method, intent.amount = event["method"], event["amount"]
            agent.current = int(event["intent"].rsplit("-", 1)[1])
        elif kind == "answer":
            intent.answers[event["step"]].append((event["status"], event["body"]))
        elif kind == "replied":
            intent.replied_before_kill = (event["status"], event["body"])
            agent.doomed.discard(agent.current)
            self.kill_agent(agent, "agent_before_reading_reply")
        elif kind == "done":
            intent.done = True

    def drain(self, timeout: float) -> None:
        try:
            agent, event = self.events.get(timeout=timeout)
        except queue.Empty:
            return
        self.handle(agent, event)
        while True:
            try:
                agent, event = self.events.get_nowait()
            except queue.Empty:
                return
            self.handle(agent, event)

    def restart_exited(self) -> None:
        """An agent that was killed mid-intent starts again on the same intent."""
        for agent in self.agents:
            killed = agent.process is not None and agent.process.returncode == -9
            if agent.exited and killed and time.time() < self.until + 30:
                self.spawn_agent(agent)

    # -- the run

    def run(self, customers: list[dict]) -> float:
        """Start the agents, break things while they work; return the seconds."""
        self.until = time.time() + self.args.seconds
        for n, customer in enumerate(customers):
            doomed = {
                i
                for i in range(self.args.intents)
                if self.args.chaos and self.rng.random() < 0.15
            }
            agent = AgentRun(
                name=f"a{n}",
                customer=customer,
                store=self.stack.workdir / f"agent-a{n}.sqlite3",
                doomed=doomed,
            )
            if len(customers) > 1:  # each sends transfers to the next one's customer
                agent.peer = customers[(n + 1) % len(customers)]["username"]
            self.agents.append(agent)
            self.spawn_agent(agent)
        chaos = self.chaos(self) if self.args.chaos else None
        self.chaos_run = chaos
        if chaos:
            self.proxy.cutting = True
        started = time.monotonic()
        hard_stop = started + self.args.seconds + 60
        while time.monotonic() < hard_stop:
            self.drain(0.2)
            self.restart_exited()
            if all(a.exited for a in self.agents):
                break
            if chaos and time.time() < self.until:
                chaos.tick()
        elapsed = time.monotonic() - started
        self.proxy.cutting = False
        for agent in self.agents:  # past the hard stop: settle finishes their work
            self.kill_agent(agent, "agent_at_hard_stop")
        return elapsed

    def settle(self, deadline: float) -> None:
        """Restart agents on every intent without a final answer; wait for the
        stack to finish what it owes (keys, callbacks, payments, shipments)."""
        self.drain(0.5)
        stack = self.stack
        if stack.worker is None or stack.worker.poll() is not None:
            stack.start_worker()
        for agent in self.agents:
            open_intents = [
                int(name.rsplit("-", 1)[1])
                for name, intent in self.intents.items()
                if name.startswith(f"{agent.name}-") and not intent.done
            ]
            if open_intents:
                self.spawn_agent(agent, only=open_intents)
            else:
                agent.exited = True
        dsn = f"{PG}/{DB}"
        while time.monotonic() < deadline:
            self.drain(0.5)
            if all(a.exited for a in self.agents) and pending_work(dsn) == 0:
                return
        for agent in self.agents:
            self.kill_agent(agent, "agent_at_settle_deadline")
        self.drain(0.5)


class Chaos:
    """Breaks one thing at a time, each kind on its own random period."""

    PERIODS = {  # seconds between events of each kind, on average
        "gunicorn_worker": 3.0,
        "provider_worker": 10.0,
        "celery_pool_process": 6.0,
        "agent_at_random": 5.0,
        "celery_worker_node": 25.0,
        "redis_restart": 25.0,
    }

    # The rare, slow events happen at least once, early enough to matter: first at
    # these fractions of the load's duration.
    FIRST = {"celery_worker_node": 0.3, "redis_restart": 0.5}

    def __init__(self, load: Load) -> None:
        self.load = load
        self.rng = load.rng
        now = time.monotonic()
        self.next = {kind: now + self._gap(kind) for kind in self.PERIODS}
        for kind, fraction in self.FIRST.items():
            self.next[kind] = now + load.args.seconds * fraction

    def _gap(self, kind: str) -> float:
        return self.rng.uniform(0.5, 1.5) * self.PERIODS[kind]

    def tick(self) -> None:
        now = time.monotonic()
        for kind, when in self.next.items():
            if now >= when:
                self.next[kind] = now + self._gap(kind)
                getattr(self, kind)()
                return  # one at a time

    def gunicorn_worker(self) -> None:
        pids = self.load.stack.web_workers_pids()
        if pids:
            os.kill(self.rng.choice(pids), signal.SIGKILL)
            self.load.tally.kills["gunicorn_worker"] += 1

    def provider_worker(self) -> None:
        pids = self.load.stack.provider_workers_pids()
        if pids:
            os.kill(self.rng.choice(pids), signal.SIGKILL)
            self.load.tally.kills["provider_worker"] += 1

    def celery_pool_process(self) -> None:
        pids = self.load.stack.worker_pool_pids()
        if pids:
            os.kill(self.rng.choice(pids), signal.SIGKILL)
            self.load.tally.kills["celery_pool_process"] += 1

    def celery_worker_node(self) -> None:
        self.load.stack.kill_worker_node()
        self.load.tally.kills["celery_worker_node"] += 1

    def redis_restart(self) -> None:
        self.load.stack.restart_cache_redis()
        self.load.tally.kills["redis_restart"] += 1

    def agent_at_random(self) -> None:
        running = [
            a for a in self.load.agents if a.process and a.process.poll() is None
        ]
        if running:
            self.load.kill_agent(self.rng.choice(running), "agent_at_random")


# -- the report ---------------------------------------------------------------


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, int(len(sorted_values) * q) - 1))
    return round(sorted_values[index], 1)


def summary(
    args: argparse.Namespace,
    load: Load,
    seconds: float,
    over: dict,
    verdict: dict,
    ledger: tuple[bool, dict],
    total_seconds: float,
    logs: list[Path] | None = None,
) -> dict[str, Any]:
    requests = load.tally.requests
    answered = sorted(ms for _, status, ms, _ in requests if status)
    # A first execution ran the view: not a replay, not a 409 (in flight; no other
    # 409 happens in this workload), not a 5xx or a broken reply.
    first_ms = sorted(
        ms
        for _, status, ms, replayed in requests
        if status and status < 500 and status != 409 and not replayed
    )
    replay_ms = sorted(ms for _, _, ms, replayed in requests if replayed)
    first, replays = len(first_ms), len(replay_ms)
    in_flight = sum(1 for _, status, _, _ in requests if status == 409)
    broken = sum(1 for _, status, _, _ in requests if status == 0)
    steps = sum(len(i.answers) for i in load.intents.values())
    # gunicorn's request logs, where it answered the provider's callbacks.
    logs = logs or [load.stack.workdir / "gunicorn.log"]
    callbacks_200 = sum(callback_acks(log) for log in logs)
    duplicate_callbacks = max(
        0,
        callbacks_200
        - verdict["callbacks_processed"]
        - verdict["callbacks_unprocessed"],
    )
    violations = verdict["violations"] + load.tally.agent_errors
    if not ledger[0]:
        violations.append("check_ledger failed: " + json.dumps(ledger[1])[:500])
    return {
        "mode": ("chaos" if args.chaos else "load") + (" short" if args.short else ""),
        "seconds": round(total_seconds, 1),
        "load_seconds": round(seconds, 1),
        "clients": args.clients,
        "intents": len(load.intents),
        "outcomes": verdict["outcomes"],
        "requests": len(requests),
        "retries": len(requests) - steps,
        "replays": replays,
        "in_flight_409": in_flight,
        "broken_replies": broken,
        "proxy_cuts": load.proxy.cuts,
        "kills": sum(load.tally.kills.values()),
        "kills_by_kind": dict(sorted(load.tally.kills.items())),
        "callbacks_acked": callbacks_200,
        "duplicate_callbacks": duplicate_callbacks,
        "duplicates_absorbed": replays + in_flight + duplicate_callbacks,
        "double_debits": verdict["double_debits"],
        "lost_intents": verdict["lost_intents"],
        "stuck_keys": verdict["stuck_keys"],
        "callbacks_unprocessed": verdict["callbacks_unprocessed"],
        "notifications_undelivered": verdict["notifications_undelivered"],
        "money_drift": verdict["money_drift"],
        "ledger_ok": ledger[0],
        "first_rps": round(first / seconds, 1) if seconds else 0.0,
        "replay_rps": round(replays / seconds, 1) if seconds else 0.0,
        "p50_ms": percentile(answered, 0.50),
        "p95_ms": percentile(answered, 0.95),
        "p99_ms": percentile(answered, 0.99),
        "first_p50_ms": percentile(first_ms, 0.50),
        "first_p99_ms": percentile(first_ms, 0.99),
        "replay_p50_ms": percentile(replay_ms, 0.50),
        "replay_p99_ms": percentile(replay_ms, 0.99),
        "bare_rps": over["bare"]["rps"],
        "keyed_rps": over["keyed"]["rps"],
        "overhead_ratio": over["ratio"],
        "violations": violations,
        "seed": args.seed,
    }


def callback_acks(log: Path) -> int:
    """Provider callbacks gunicorn answered 200 (from its JSON request log)."""
    count = 0
    if not log.exists():
        return 0
    with log.open(errors="replace") as lines:
        for line in lines:
            if '"api-payment-callback"' in line and '"status": 200' in line:
                count += 1
    return count


def print_table(result: dict) -> None:
    rows = [
        ("mode", result["mode"]),
        ("run, load seconds", f"{result['seconds']}, {result['load_seconds']}"),
        ("agents, intents", f"{result['clients']}, {result['intents']}"),
        ("outcomes (method, pay status)", json.dumps(result["outcomes"])),
        ("requests (retries)", f"{result['requests']} ({result['retries']})"),
        (
            "first executions/s, replays/s",
            f"{result['first_rps']}, {result['replay_rps']}",
        ),
        (
            "p50 / p95 / p99 ms, all requests",
            f"{result['p50_ms']} / {result['p95_ms']} / {result['p99_ms']}",
        ),
        (
            "p50 / p99 ms, first executions",
            f"{result['first_p50_ms']} / {result['first_p99_ms']}",
        ),
        (
            "p50 / p99 ms, replays",
            f"{result['replay_p50_ms']} / {result['replay_p99_ms']}",
        ),
        (
            "preorders/s without / with the layer",
            f"{result['bare_rps']} / {result['keyed_rps']}",
        ),
        ("overhead ratio (with / without)", result["overhead_ratio"]),
        ("kills", f"{result['kills']} {json.dumps(result['kills_by_kind'])}"),
        ("replies cut by the proxy", result["proxy_cuts"]),
        ("broken replies seen by agents", result["broken_replies"]),
        ("409 in flight, replays", f"{result['in_flight_409']}, {result['replays']}"),
        (
            "callbacks acked (duplicates)",
            f"{result['callbacks_acked']} ({result['duplicate_callbacks']})",
        ),
        ("duplicates absorbed", result["duplicates_absorbed"]),
        ("double debits", result["double_debits"]),
        ("lost intents", result["lost_intents"]),
        ("keys stuck in processing", result["stuck_keys"]),
        ("callbacks unprocessed", result["callbacks_unprocessed"]),
        (
            "provider notifications not yet acknowledged",
            result["notifications_undelivered"],
        ),
        ("money drift (minor units)", result["money_drift"]),
        ("check_ledger", "clean" if result["ledger_ok"] else "FAILED"),
        ("violations", len(result["violations"])),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    for violation in result["violations"][:50]:
        print(f"VIOLATION: {violation}")


# -- main ------------------------------------------------------------------------


def _since(begun: float) -> str:
    return f"[{time.monotonic() - begun:5.1f} s]"


def _interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = options(argv)
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGINT, _interrupted)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ledger-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    begun = time.monotonic()
    print(f"work directory: {workdir} (seed {args.seed})", flush=True)
    stack = Stack(
        workdir,
        web_workers=args.web_workers,
        web_threads=args.web_threads,
        lease_seconds=LEASE_SECONDS,
    )
    proxy = CuttingProxy(stack.web_port, cut_probability=0.05)
    stack.callback_url = proxy.url  # callbacks go through the cutting proxy too
    try:
        # The first agent's wallet runs dry: its later intents end in a stored
        # `insufficient_funds`, a clear final answer with no debit.
        opening = {f"agent-{n}": 2000 * args.intents for n in range(args.clients)}
        opening["agent-0"] = 10_000
        customers = stack.prepare_database({**opening, "overhead": 0})
        stack.start()
        print(f"{_since(begun)} stack up; measuring overhead", flush=True)
        over = overhead(
            stack.web_url, customers["overhead"]["token"], args.overhead_seconds
        )
        print(f"{_since(begun)} load" + (" and chaos" * args.chaos), flush=True)
        load = Load(args, stack, proxy)
        seconds = load.run([customers[name] for name in opening])
        print(f"{_since(begun)} settling", flush=True)
        load.settle(time.monotonic() + args.settle_seconds)
        env = stack.env()
        print(f"{_since(begun)} verdict", flush=True)
        verdict = judge(load.intents, database_facts(f"{PG}/{DB}"), opening)
        ledger = check_ledger(env, str(ROOT))
    finally:
        stack.close()
        proxy.close()
    result = summary(
        args, load, seconds, over, verdict, ledger, time.monotonic() - begun
    )
    print_table(result)
    print(json.dumps(result, sort_keys=True), flush=True)
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
