"""The real stack of the load run, started and stopped as process groups.

PostgreSQL is the machine's own (a database of our own, dropped and created per run);
everything else is ours: two redis-servers on free ports (one for the idempotency
locks and replay cache, db 12, which the chaos restarts; one for the Celery broker,
db 10, which it leaves alone), gunicorn with several workers, the provider simulator
in a gunicorn of its own (as in docker-compose.yml: served by the app's own sync
workers, a pay request that calls the provider waits for a worker that is busy with
pay requests), a Celery worker and Celery beat. Each process runs in its own process
group and also gets SIGKILL from the kernel if the runner dies (PR_SET_PDEATHSIG), and
every group id is written to `<workdir>/pgids` so a supervisor (the test) can kill
what is left whatever happened.
"""

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.agent import CHAOS_SKU  # noqa: E402
from ledger.supervisor import die_with_parent  # noqa: E402
from tests.servers import (  # noqa: E402
    children,
    free_port,
    redis_command,
    wait_for_port,
    wait_until_up,
)

PG = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
DB = os.environ.get("CHAOS_DB", "ledger_chaos")  # dropped and created per run
# The product bench/agent.py orders by items (one intent in four).
CHAOS_PRICE = 150
CHAOS_STOCK = 10**9
BIN = ROOT / ".venv/bin"
REAPER = """
import os, signal, sys
sys.stdin.read()  # returns when the runner closes the pipe or dies, however it dies
with open(sys.argv[1]) as pgids:
    for pgid in pgids.read().split():
        try:
            os.killpg(int(pgid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
"""


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL a whole process group at once (a crash, not a shutdown)."""
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


class Stack:
    """Start, SIGKILL and restart the run's processes; `close()` ends them all."""

    def __init__(
        self,
        workdir: Path,
        *,
        web_workers: int,
        web_threads: int = 1,
        lease_seconds: int,
        settings: str = "bench.chaos_settings",
        database: str = DB,
    ) -> None:
        self.workdir = workdir
        self.web_workers, self.web_threads = web_workers, web_threads
        self.settings, self.database = settings, database
        self.processes: list[subprocess.Popen] = []
        # Kills every group in `pgids` once the runner is gone, even by SIGKILL (a
        # gunicorn worker whose master died of PR_SET_PDEATHSIG lives on otherwise).
        (workdir / "pgids").touch()
        self.reaper = subprocess.Popen(
            [sys.executable, "-c", REAPER, str(workdir / "pgids")],
            stdin=subprocess.PIPE,
            start_new_session=True,
        )
        self.cache_port, self.broker_port = free_port(), free_port()
        self.web_port, self.provider_port = free_port(), free_port()
        self.callback_url = f"http://127.0.0.1:{self.web_port}"  # set by the runner
        self.cache_redis: subprocess.Popen | None = None
        self.web: subprocess.Popen | None = None
        self.provider: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None
        self.beat: subprocess.Popen | None = None
        self.lease_seconds = lease_seconds

    @property
    def web_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def provider_url(self) -> str:
        return f"http://127.0.0.1:{self.provider_port}"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": self.settings,
            "DATABASE_URL": f"{PG}/{self.database}",
            "REDIS_URL": f"redis://127.0.0.1:{self.cache_port}/12",
            "CELERY_BROKER_URL": f"redis://127.0.0.1:{self.broker_port}/10",
            "IDEMPOTENCY_LEASE_SECONDS": str(self.lease_seconds),
            "PAYMENT_PROVIDER_URL": f"{self.provider_url}/provider",
            "PROVIDER_PUBLIC_URL": self.provider_url,
            "PROVIDER_CALLBACK_URL": f"{self.callback_url}/api/v1/payments/callback",
            "PROVIDER_DELIVER_TWICE": "1",
            "PROVIDER_RETRY_SCALE": "0.1",
            "PAYMENT_PENDING_TIMEOUT_SECONDS": "5",
            "LEDGER_DATA_DIR": str(self.workdir / "var"),
            "PYTHONUNBUFFERED": "1",
        }

    def spawn(self, name: str, argv: list[str], **popen) -> subprocess.Popen:
        log = (self.workdir / f"{name}.log").open("a")
        process = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=popen.pop("env", None) or self.env(),
            stdout=popen.pop("stdout", log),
            stderr=popen.pop("stderr", subprocess.STDOUT),
            start_new_session=True,
            # (SIGKILL when the runner dies: every process is spawned from its
            # main thread, whose end is what the kernel watches)
            preexec_fn=die_with_parent(signal.SIGKILL),
            **popen,
        )
        log.close()
        self.processes.append(process)
        with (self.workdir / "pgids").open("a") as pgids:
            pgids.write(f"{process.pid}\n")
        return process

    # -- set-up ------------------------------------------------------------------

    def prepare_database(self, customers: dict[str, int]) -> dict[str, dict]:
        """Drop and create the database, migrate, create the customers with their
        opening balances; {name: {"token", "account", "balance"}}."""
        with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {self.database} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {self.database}")
        manage = [str(BIN / "python"), "manage.py"]
        subprocess.run(
            [*manage, "migrate", "-v0"], cwd=ROOT, env=self.env(), check=True
        )
        script = (
            "import json\n"
            "from io import StringIO\n"
            "from django.core.management import call_command\n"
            f"for name, balance in {customers!r}.items():\n"
            "    out = StringIO()\n"
            "    call_command('create_customer', name, balance=balance, stdout=out)\n"
            "    print(out.getvalue().strip())\n"
            # The product some agents order by items: stock enough never to run out,
            # so every intent still ends paid or refused for money, never for stock.
            f"call_command('create_product', {CHAOS_SKU!r}, name='Chaos tea',"
            f" price={CHAOS_PRICE}, stock={CHAOS_STOCK}, stdout=StringIO())\n"
        )
        out = subprocess.run(
            [*manage, "shell", "-c", script],
            cwd=ROOT,
            env=self.env(),
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        made = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        return {
            row["username"]: {**row, "balance": customers[row["username"]]}
            for row in made
        }

    def start(self) -> None:
        self.start_redis("broker", self.broker_port)
        self.cache_redis = self.start_redis("cache", self.cache_port)
        self.web = self.start_gunicorn(
            "gunicorn", self.web_port, self.web_workers, threads=self.web_threads
        )
        self.provider = self.start_gunicorn("provider", self.provider_port, 2)
        self.start_worker()
        self.beat = self.spawn(
            "beat", [str(BIN / "celery"), "-A", "ledger", "beat", "--loglevel", "INFO"]
        )

    def start_redis(self, name: str, port: int) -> subprocess.Popen:
        process = self.spawn(f"redis-{name}", redis_command(port))
        if wait_for_port(port):
            return process
        raise RuntimeError(f"redis-server on {port} never came up")

    def start_gunicorn(
        self,
        name: str,
        port: int,
        workers: int,
        settings: str | None = None,
        threads: int = 1,
    ) -> subprocess.Popen:
        """gunicorn on `port`, set up as the project ships it (`bench/gunicorn.py`),
        `threads` a worker (1: sync workers); with `settings`, another settings
        module than the stack's own (a contender's server)."""
        env = {**self.env(), "DJANGO_SETTINGS_MODULE": settings or self.settings}
        process = self.spawn(
            name,
            [
                str(BIN / "gunicorn"),
                "ledger.wsgi",
                "--config",
                "python:bench.gunicorn",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                str(workers),
                "--threads",
                str(threads),
                "--timeout",
                "60",
                "--graceful-timeout",
                "1",
                "--backlog",
                "512",
            ],
            env=env,
        )
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url, process, workers, self.workdir / f"{name}.log")
        return process

    def start_worker(self) -> None:
        log = self.workdir / "celery.log"
        mark = log.stat().st_size if log.exists() else 0
        self.worker = self.spawn(
            "celery",
            [
                str(BIN / "celery"),
                "-A",
                "ledger",
                "worker",
                "--pool=prefork",
                "--concurrency=2",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--loglevel=INFO",
            ],
        )
        deadline = time.monotonic() + 60
        while "ready." not in log.read_text()[mark:]:
            if self.worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Celery worker did not start; see {log}")
            time.sleep(0.1)

    # -- chaos -------------------------------------------------------------------

    def web_workers_pids(self) -> list[int]:
        return children(self.web.pid) if self.web else []

    def provider_workers_pids(self) -> list[int]:
        return children(self.provider.pid) if self.provider else []

    def worker_pool_pids(self) -> list[int]:
        return children(self.worker.pid) if self.worker else []

    def restart_cache_redis(self) -> None:
        """SIGKILL the cache's redis-server and start an empty one on its port."""
        if self.cache_redis is not None:
            kill_group(self.cache_redis)
        self.cache_redis = self.start_redis("cache", self.cache_port)

    def kill_worker_node(self) -> None:
        """SIGKILL the Celery worker, pool and all, then start a new one."""
        if self.worker is not None:
            kill_group(self.worker)
        self.start_worker()

    def close(self) -> None:
        """SIGTERM every group, give them a few seconds together, SIGKILL the rest."""
        for process in self.processes:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for process in self.processes:
            with suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
        for process in self.processes:
            kill_group(process)  # also orphans left in a group whose leader died
        if self.reaper.stdin is not None:
            self.reaper.stdin.close()
        self.reaper.wait(timeout=10)
