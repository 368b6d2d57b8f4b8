"""Proof under fire across several hosts: the chaos run of `make chaos`, scaled out.

    .venv/bin/python bench/cluster.py            # make chaos-cluster
    .venv/bin/python bench/cluster.py --short    # about two minutes

The stack (nothing mocked; PostgreSQL is the machine's own, a database of our own):

- `--hosts` app hosts (default 3). Each is a process group in namespaces of its own
  (`unshare --uts --mount`): its own hostname (`app-1`, ...) and its own filesystem
  where the app keeps its files (a tmpfs mounted on the same LEDGER_DATA_DIR path on
  every host, as identical pods or machines have), running gunicorn and a Celery
  worker. Hosts 1 and 2 also run Celery beat; one beat acts at a time. The last host's
  clock runs `--skew` seconds ahead (libfaketime), as a badly synchronised machine's.
- nginx in front of them (deploy/nginx.conf, one upstream line per host), and the
  run's cutting proxy in front of nginx; the provider simulator in its own gunicorn.
- A Redis Cluster of three primaries with a replica each for the idempotency locks and
  replay cache (`REDIS_CLUSTER=1`; tests/redis_cluster.py), and RabbitMQ (the
  machine's, a vhost of our own) as the Celery broker: quorum queues, native delays.

The load and the verdict are bench/load.py's (retrying agents, the audit from the
database, `check_ledger`), plus merchant order numbers minted twice. Chaos during the
load, besides load.py's SIGKILLed gunicorn workers, Celery pool processes and agents:
whole hosts SIGKILLed and started again, the beat host killed (the other beat takes
over), a Redis primary SIGKILLed (its replica takes over; the old primary comes back
as a replica), RabbitMQ restarted. The last line is one JSON object; the exit status
is 1 on any violation.
"""

import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import contextlib

from bench import load as single
from bench.load import Chaos, Load, _interrupted, _since, overhead, summary
from bench.proxy import CuttingProxy
from bench.stack import BIN, PG, ROOT, Stack, kill_group
from bench.verdict import check_ledger, database_facts, judge
from tests.redis_cluster import OwnCluster
from tests.servers import children, free_port

LEASE_SECONDS = 5
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
FAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), "")
BEAT_HOSTS = (1, 2)
RABBITMQ = "amqp://guest:guest@127.0.0.1:5672"


def rabbitmqctl(*args: str) -> None:
    subprocess.run(
        ["rabbitmqctl", "--quiet", *args], check=True, capture_output=True, timeout=120
    )


def descendants(pid: int) -> list[int]:
    found = []
    for child in children(pid):
        found += [child, *descendants(child)]
    return found


def command(pid: int) -> list[str]:
    """The process's arguments, as it was started."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone
        return []
    return raw.decode(errors="replace").split("\0")[:-1]


def celery_pool_pids(host: int) -> list[int]:
    """The pool processes of the Celery worker running under `host`: the children
    of a process started as `celery ... worker`. Not those of the host's shell,
    whose script names the worker too: they are the gunicorn master, the worker
    itself and beat, which a pool process's death must not take with it."""
    pids = []
    for pid in descendants(host):
        argv = command(pid)
        if "worker" in argv and any(Path(a).name == "celery" for a in argv[:2]):
            pids += children(pid)
    return pids


class ClusterStack(Stack):
    """The hosts, nginx, the Redis Cluster, RabbitMQ and the provider simulator."""

    def __init__(self, workdir: Path, *, hosts: int, skew: int) -> None:
        super().__init__(
            workdir, web_workers=2, web_threads=4, lease_seconds=LEASE_SECONDS
        )
        self.hosts = hosts
        self.skew = skew
        self.host_ports = {n: free_port() for n in range(1, hosts + 1)}
        self.host_groups: dict[int, subprocess.Popen] = {}
        (workdir / "redis-cluster").mkdir(exist_ok=True)
        self.redis = OwnCluster(workdir / "redis-cluster", spawn=self.spawn)
        self.vhost = f"ledger-chaos-{uuid.uuid4().hex[:8]}"
        self.rabbit_restarts = 0
        self.data_dir = workdir / "host-data"  # the same path on every host
        self.data_dir.mkdir(exist_ok=True)

    def env(self) -> dict[str, str]:
        return {
            **super().env(),
            "REDIS_URL": self.redis.url,
            "REDIS_CLUSTER": "1",
            "CELERY_BROKER_URL": f"{RABBITMQ}/{self.vhost}",
            "LEDGER_DATA_DIR": str(self.data_dir),
            # Several hosts pay one merchant: its credits spread over sub-accounts,
            # swept by whichever beat acts, killed or not.
            "MERCHANT_SUB_ACCOUNTS": "4",
        }

    # -- the hosts

    def host_script(self, n: int) -> str:
        pids = self.workdir / f"app-{n}"
        celery = f"{BIN}/celery -A ledger"
        lines = [
            "set -e",
            f"hostname app-{n}",
            f"mount -t tmpfs tmpfs {self.data_dir}",
            f"mkdir -p {self.data_dir}/metrics",
            f"export PROMETHEUS_MULTIPROC_DIR={self.data_dir}/metrics",
            # A machine boots with an empty /run. The runner reads gunicorn's pid
            # file from outside the host, so it lives in the work directory and
            # outlives a power cut; left there, it would name the killed master,
            # which lingers as a zombie until init reaps it, and the new gunicorn
            # would refuse to start ("Already running"), leaving the host without
            # a web server for the rest of the run.
            f"rm -f {pids}.gunicorn.pid",
            "set +e",
            f"{BIN}/gunicorn ledger.wsgi --config python:ledger.gunicorn"
            f" --bind 127.0.0.1:{self.host_ports[n]}"
            f" --workers {self.web_workers} --threads {self.web_threads}"
            " --timeout 60 --graceful-timeout 1"
            f" --backlog 512 --pid {pids}.gunicorn.pid &",
            f"{celery} worker --pool=prefork --concurrency=2 --without-gossip"
            " --without-mingle --without-heartbeat --loglevel=INFO &",
        ]
        if n in BEAT_HOSTS:
            lines.append(
                f"{celery} beat --loglevel INFO --pidfile {self.data_dir}/beat.pid &"
            )
        lines.append("wait")
        return "\n".join(lines)

    def start_host(self, n: int, *, wait: bool = True) -> None:
        env = self.env()
        if n == self.hosts and self.skew:
            env |= {
                "LD_PRELOAD": FAKETIME,
                "FAKETIME": f"+{self.skew}s",
                # Monotonic clocks move by the same offset: libfaketime's
                # absolute sleeps fail (EINVAL) when only the wall clock moves.
                "FAKETIME_DONT_FAKE_MONOTONIC": "0",
                "FAKETIME_DONT_RESET": "1",
            }
        log = self.workdir / f"gunicorn-app-{n}.log"
        mark = log.stat().st_size if log.exists() else 0
        self.host_groups[n] = self.spawn(
            f"gunicorn-app-{n}",
            [
                "unshare",
                "--uts",
                "--mount",
                "--propagation",
                "private",
                "--fork",
                "sh",
                "-c",
                self.host_script(n),
            ],
            env=env,
        )
        if not wait:
            return
        deadline = time.monotonic() + 90
        url = f"http://127.0.0.1:{self.host_ports[n]}/healthz"
        while True:
            up = "ready." in log.read_text(errors="replace")[mark:]
            if up:
                try:
                    up = httpx.get(url, timeout=1).status_code == 200
                except httpx.HTTPError:
                    up = False
            if up:
                return
            if self.host_groups[n].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"host app-{n} did not start; see {log}")
            time.sleep(0.2)

    def kill_host(self, n: int) -> None:
        """SIGKILL the whole host, every process on it, as a power cut would."""
        kill_group(self.host_groups[n])

    # -- the gateway

    def start_gateway(self) -> None:
        tmp = self.workdir / "nginx"
        tmp.mkdir(exist_ok=True)
        servers = "\n".join(
            f"        server 127.0.0.1:{port} max_fails=1 fail_timeout=3s;"
            for port in self.host_ports.values()
        )
        config = (ROOT / "deploy/nginx.conf").read_text()
        for pattern, replacement in [
            (r"\n\s*server web:8000 [^;]*;", "\n" + servers),
            (r"listen 8080;", f"listen 127.0.0.1:{self.web_port};"),
            (r"pid [^;]+;", f"pid {tmp}/nginx.pid;"),
            (r"access_log /dev/stdout", f"access_log {tmp}/access.log"),
            (r"alias /srv/static/;", f"alias {ROOT}/static/;"),
            (r"(_temp_path) /tmp/", f"\\1 {tmp}/"),
        ]:
            config, count = re.subn(pattern, replacement, config)
            if not count:
                raise RuntimeError(f"deploy/nginx.conf no longer has {pattern!r}")
        if os.geteuid() == 0:
            config = "user root;\n" + config
        (tmp / "nginx.conf").write_text(config)
        self.spawn(
            "nginx",
            [
                NGINX,
                "-c",
                f"{tmp}/nginx.conf",
                "-p",
                f"{tmp}/",
                "-e",
                f"{tmp}/error.log",
                "-g",
                "daemon off;",
            ],
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{self.web_url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("nginx never came up")
            time.sleep(0.1)

    # -- Stack's interface, for bench/load.py

    def start(self) -> None:
        for n in self.host_ports:
            self.start_host(n)
        self.start_gateway()
        self.provider = self.start_gunicorn("provider", self.provider_port, 2)

    def prepare_services(self) -> None:
        self.redis.start()
        rabbitmqctl("add_vhost", self.vhost)
        rabbitmqctl("set_permissions", "-p", self.vhost, "guest", ".*", ".*", ".*")

    @property
    def worker(self) -> subprocess.Popen | None:  # type: ignore[override]
        """A host that is down, if any (load.py restarts "the worker" when dead)."""
        for process in self.host_groups.values():
            if process.poll() is not None:
                return process
        return next(iter(self.host_groups.values()), None)

    @worker.setter
    def worker(self, value: subprocess.Popen | None) -> None:
        pass  # the hosts are the workers

    def start_worker(self) -> None:
        for n, process in self.host_groups.items():
            if process.poll() is not None:
                self.start_host(n)

    def web_workers_pids(self) -> list[int]:
        pids = []
        for n, group in self.host_groups.items():
            master = self.workdir / f"app-{n}.gunicorn.pid"
            if group.poll() is None and master.exists():
                with contextlib.suppress(ValueError):
                    pids += children(int(master.read_text()))
        return pids

    def worker_pool_pids(self) -> list[int]:
        pids = []
        for group in self.host_groups.values():
            if group.poll() is None:
                pids += celery_pool_pids(group.pid)
        return pids

    def restart_rabbitmq(self) -> None:
        rabbitmqctl("stop_app")
        time.sleep(1)
        rabbitmqctl("start_app")
        self.rabbit_restarts += 1

    def close(self) -> None:
        super().close()
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            rabbitmqctl("delete_vhost", self.vhost)


class ClusterChaos(Chaos):
    """load.py's chaos on the hosts, plus hosts, a Redis primary and the broker."""

    PERIODS = {  # the rare kinds first: one event per tick, the first one due
        "host": 30.0,
        "redis_primary": 30.0,
        "beat_host": 10_000.0,
        "rabbitmq": 45.0,
        "gunicorn_worker": 4.0,
        "provider_worker": 12.0,
        "celery_pool_process": 8.0,
        "agent_at_random": 5.0,
    }
    FIRST = {"host": 0.1, "rabbitmq": 0.2, "redis_primary": 0.3, "beat_host": 0.45}

    def __init__(self, load: Load) -> None:
        super().__init__(load)
        self.reboot: dict[int, float] = {}  # host -> when it boots again

    @property
    def stack(self) -> ClusterStack:
        return self.load.stack  # type: ignore[return-value]

    def _restart(self, n: int, kind: str) -> None:
        """Power the host off now; it boots again a moment later (see tick)."""
        self.stack.kill_host(n)
        self.load.tally.kills[kind] += 1
        self.reboot[n] = time.monotonic() + self.rng.uniform(1, 3)

    def tick(self) -> None:
        now = time.monotonic()
        for n, when in list(self.reboot.items()):
            if now >= when:
                del self.reboot[n]
                self.stack.start_host(n, wait=False)  # nginx sends traffic elsewhere
        super().tick()

    def catch_up(self) -> None:
        """The load ended before some rare kind's turn (slow steps on two shared
        cores): break it now, while the settling agents still work."""
        for kind in self.FIRST:
            counted = "rabbitmq_restart" if kind == "rabbitmq" else kind
            if not self.load.tally.kills[counted]:
                getattr(self, kind)()
        for n in list(self.reboot):
            del self.reboot[n]
            self.stack.start_host(n)

    def host(self) -> None:
        hosts = [n for n in self.stack.host_ports if n not in BEAT_HOSTS[:1]]
        self._restart(self.rng.choice(hosts), "host")

    def beat_host(self) -> None:
        self._restart(BEAT_HOSTS[0], "beat_host")

    def redis_primary(self) -> None:
        self.stack.redis.fail_over(self.rng)
        self.load.tally.kills["redis_primary"] += 1

    def rabbitmq(self) -> None:
        self.stack.restart_rabbitmq()
        self.load.tally.kills["rabbitmq_restart"] += 1


def duplicate_order_numbers(dsn: str) -> int:
    """Merchant order numbers minted more than once, for anyone (the unique
    constraint would have turned a second one into a 500; count both ways)."""
    with psycopg.connect(dsn) as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM (SELECT merchant_order_no FROM orders_order"
            " GROUP BY 1 HAVING count(*) > 1) AS twice"
        ).fetchone() or (0,)
    return int(count)


def merchant_sub_accounts(dsn: str) -> tuple[int, int]:
    """How many merchant sub-accounts took payments, and how many sweeps moved
    their money up (the verdict's merchant total counts both sides alike)."""
    with psycopg.connect(dsn) as conn:
        (paid,) = conn.execute(
            "SELECT count(DISTINCT p.account_id) FROM ledger_posting p"
            " JOIN ledger_account a ON a.id = p.account_id"
            " WHERE a.parent_id IS NOT NULL AND a.kind = 'merchant' AND p.amount > 0"
        ).fetchone() or (0,)
        (sweeps,) = conn.execute(  # (the outside world's sub-accounts are swept too)
            "SELECT count(DISTINCT e.id) FROM ledger_journalentry e"
            " JOIN ledger_posting p ON p.entry_id = e.id"
            " JOIN ledger_account a ON a.id = p.account_id"
            " WHERE e.reference LIKE 'sweep:%' AND a.kind = 'merchant'"
        ).fetchone() or (0,)
    return int(paid), int(sweeps)


def options(argv: list[str] | None) -> argparse.Namespace:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--hosts", type=int, default=3)
    extra.add_argument("--skew", type=int, default=180, help="seconds, last host")
    known, rest = extra.parse_known_args(argv)
    args = single.options([*rest, "--chaos"])
    args.hosts, args.skew = known.hosts, known.skew
    if args.short:
        args.seconds = max(args.seconds, 60.0)
    return args


def main(argv: list[str] | None = None) -> int:
    args = options(argv)
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGINT, _interrupted)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ledger-cluster-"))
    workdir.mkdir(parents=True, exist_ok=True)
    begun = time.monotonic()
    print(f"work directory: {workdir} (seed {args.seed})", flush=True)
    stack = ClusterStack(workdir, hosts=args.hosts, skew=args.skew)
    proxy = CuttingProxy(stack.web_port, cut_probability=0.05)
    stack.callback_url = proxy.url
    try:
        stack.prepare_services()
        opening = {f"agent-{n}": 2000 * args.intents for n in range(args.clients)}
        opening["agent-0"] = 10_000
        customers = stack.prepare_database({**opening, "overhead": 0})
        stack.start()
        print(
            f"{_since(begun)} {args.hosts} hosts, Redis Cluster "
            f"{stack.redis.primaries()}, RabbitMQ vhost {stack.vhost}; overhead",
            flush=True,
        )
        over = overhead(
            stack.web_url, customers["overhead"]["token"], args.overhead_seconds
        )
        print(f"{_since(begun)} load and chaos", flush=True)
        load = Load(args, stack, proxy, ClusterChaos)
        seconds = load.run([customers[name] for name in opening])
        if isinstance(load.chaos_run, ClusterChaos):
            load.chaos_run.catch_up()
        print(f"{_since(begun)} settling", flush=True)
        load.settle(time.monotonic() + args.settle_seconds)
        dsn = f"{PG}/{stack.database}"
        verdict = judge(load.intents, database_facts(dsn), opening)
        ledger = check_ledger(stack.env(), str(ROOT))
        duplicates = duplicate_order_numbers(dsn)
        subs, sweeps = merchant_sub_accounts(dsn)
        primaries = len(stack.redis.primaries())
    finally:
        stack.close()
        proxy.close()
    logs = sorted(workdir.glob("gunicorn-app-*.log"))
    total = time.monotonic() - begun
    result = summary(args, load, seconds, over, verdict, ledger, total, logs)
    result["mode"] = "chaos-cluster" + (" short" if args.short else "")
    result |= {
        "hosts": args.hosts,
        "redis_cluster_primaries": primaries,
        "redis_failovers": stack.redis.failovers,
        "broker": "rabbitmq",
        "rabbitmq_restarts": stack.rabbit_restarts,
        "skewed_host_seconds": args.skew,
        "duplicate_order_numbers": duplicates,
        "merchant_sub_accounts_paid": subs,
        "merchant_sweeps": sweeps,
    }
    if duplicates:
        result["violations"].append(f"{duplicates} merchant order numbers minted twice")
    single.print_table(result)
    print(json.dumps(result, sort_keys=True), flush=True)
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
