"""Real processes for tests: a gunicorn serving the app, a throwaway redis-server.

Each is started in its own process group and killed, group and all, when the test
ends, so nothing outlives the test that started it.
"""

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(process: subprocess.Popen) -> None:
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@contextmanager
def gunicorn(
    tmp_path: Path, settings_module: str, workers: int = 1, **env: str
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Serve the app on the test database; yield (base URL, master process)."""
    port = free_port()
    db = connection.settings_dict
    environment = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": settings_module,
        "DATABASE_URL": (
            f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
        ),
        **env,
    }
    log = (tmp_path / f"gunicorn-{port}.log").open("w")
    process = subprocess.Popen(
        [
            str(ROOT / ".venv/bin/gunicorn"),
            "ledger.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(workers),
            "--graceful-timeout",
            "1",
            "--timeout",
            "60",
        ],
        cwd=ROOT,
        env=environment,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, process, workers)
        yield url, process
    finally:
        stop(process)
        log.close()


def wait_until_up(url: str, process: subprocess.Popen, workers: int = 1) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, "the server died on start"
        with suppress(httpx.HTTPError):
            if (
                httpx.get(f"{url}/healthz", timeout=1).status_code == 200
                and len(children(process.pid)) >= workers
            ):
                return
        time.sleep(0.1)
    raise AssertionError(f"{url} never came up")


def redis_command(port: int) -> list[str]:
    """A throwaway redis-server: loopback only, nothing kept on disk."""
    port_args = ["--port", str(port), "--bind", "127.0.0.1"]
    return ["redis-server", *port_args, "--save", "", "--appendonly", "no"]


def wait_for_port(port: int, seconds: float = 10) -> bool:
    """True once something accepts connections on 127.0.0.1:`port`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return True
        time.sleep(0.05)
    return False


@contextmanager
def redis_server() -> Iterator[tuple[str, subprocess.Popen]]:
    """A redis-server of our own on a free port, to kill at will."""
    port = free_port()
    process = subprocess.Popen(
        redis_command(port), stdout=subprocess.DEVNULL, start_new_session=True
    )
    wait_for_port(port)
    try:
        yield f"redis://127.0.0.1:{port}/0", process
    finally:
        stop(process)
