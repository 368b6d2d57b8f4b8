"""Real processes for tests: a gunicorn serving the app, a throwaway redis-server.

Each is started in its own process group and killed, group and all, when the test
ends, so nothing outlives the test that started it.
"""

import os
import shlex
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
import pytest
from django.db import connection
from kombu import Connection

from ledger.supervisor import free_port

ROOT = Path(__file__).resolve().parent.parent


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


def procfile_options(name: str = "web") -> tuple[int, list[str]]:
    """The workers and the other options of the Procfile's gunicorn line `name`
    (what `make run` starts), but its --bind."""
    (line,) = [
        line
        for line in (ROOT / "Procfile").read_text().splitlines()
        if line.startswith(f"{name}:")
    ]
    args = shlex.split(line.split(":", 1)[1])
    args = args[args.index("ledger.wsgi") + 1 :]
    workers, options = 1, []
    while args:
        option = args.pop(0)
        # A value never starts with "-", but "-" itself (stdout, as in
        # `--access-logfile -`) is one.
        takes = args and (args[0] == "-" or not args[0].startswith("-"))
        value = args.pop(0) if takes else ""
        if option == "--workers":
            workers = int(value)
        elif option != "--bind":
            options += [option, value] if value else [option]
    return workers, options


@contextmanager
def gunicorn(
    tmp_path: Path, settings_module: str, workers: int = 1, **env: str
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Serve the app on the test database as the Procfile's web line does (the
    project's gunicorn settings, its threads), with `workers` workers and a grace
    of one second on stop; yield (base URL, master process)."""
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
    log_path = tmp_path / f"gunicorn-{port}.log"
    log = log_path.open("w")
    process = subprocess.Popen(
        [
            str(ROOT / ".venv/bin/gunicorn"),
            "ledger.wsgi",
            *procfile_options()[1],
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(workers),
            "--graceful-timeout",
            "1",
        ],
        cwd=ROOT,
        env=environment,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, process, workers, log_path)
        yield url, process
    finally:
        stop(process)
        log.close()


def wait_until_up(
    url: str, process: subprocess.Popen, workers: int = 1, log: Path | None = None
) -> None:
    """Until `url` answers /healthz with all `workers` started; a server that dies
    or never answers fails the caller with the end of its `log`."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server died on start{log_end(log)}")
        with suppress(httpx.HTTPError):
            if (
                httpx.get(f"{url}/healthz", timeout=1).status_code == 200
                and len(children(process.pid)) >= workers
            ):
                return
        time.sleep(0.1)
    raise AssertionError(f"{url} never came up{log_end(log)}")


def log_end(log: Path | None, lines: int = 30) -> str:
    if log is None or not log.exists():
        return ""
    end = log.read_text(errors="replace").splitlines()[-lines:]
    return f"; {log.name} ends:\n" + "\n".join(end)


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


RABBITMQ = "amqp://guest:guest@127.0.0.1:5672"


def rabbitmqctl(*args: str) -> str:
    return subprocess.run(
        ["rabbitmqctl", "--quiet", *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout


@contextmanager
def rabbitmq_vhost() -> Iterator[str]:
    """A vhost of our own on the machine's RabbitMQ (guest/guest): its URL."""
    name = f"ledger-test-{uuid.uuid4().hex[:8]}"
    try:
        with Connection(f"{RABBITMQ}//") as probe:
            probe.ensure_connection(max_retries=1, timeout=5)
    except Exception as exc:
        pytest.fail(f"RabbitMQ does not answer on 127.0.0.1:5672 ({exc})")
    rabbitmqctl("add_vhost", name)
    rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
    try:
        yield f"{RABBITMQ}/{name}"
    finally:
        rabbitmqctl("delete_vhost", name)


def raw_exchange(url: str, request: bytes, body_parts: Iterable[bytes] = ()):
    """Speak HTTP/1.1 by hand, for requests a client library will not send: send
    `request`, then `body_parts` for as long as the server has not answered; return
    (status, headers with lower-case names, body, how many body bytes were sent)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(request)
        sent = 0
        conn.settimeout(0.05)
        data = b""
        for part in body_parts:
            with suppress(TimeoutError):  # has it answered already?
                data += conn.recv(65536)
            if data:
                break
            conn.sendall(part)
            sent += len(part)
        conn.settimeout(10)
        while not complete(data):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = dechunk(body)
    return int(lines[0].split()[1]), headers, body, sent


def complete(data: bytes) -> bool:
    """Has the whole answer arrived (the server may keep the connection open)?"""
    head, found, body = data.partition(b"\r\n\r\n")
    if not found:
        return False
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
        if line.startswith(b"transfer-encoding:") and b"chunked" in line:
            return body.endswith(b"0\r\n\r\n")
    return False


def dechunk(body: bytes) -> bytes:
    decoded = b""
    while body:
        size, _, body = body.partition(b"\r\n")
        length = int(size.split(b";")[0], 16)
        decoded, body = decoded + body[:length], body[length + 2 :]
        if not length:
            break
    return decoded


class OwnRedis:
    """A redis-server of our own on a free loopback port, to restart at will."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            redis_command(self.port), stdout=subprocess.DEVNULL, start_new_session=True
        )
        assert wait_for_port(self.port), "redis-server did not start"

    def restart(self) -> None:
        """Kill it and start an empty one on the same port; the app's client then
        reconnects (its pooled connections to the old server are dropped)."""
        assert self.process is not None
        stop(self.process)
        self.start()
        from redis import Redis

        from idempotency.redis import get_redis

        client = get_redis()
        assert isinstance(client, Redis)
        client.connection_pool.disconnect()

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)


# -- benchmark runners (bench/load.py, bench/cluster.py) as the tests run them --------


def groups_alive(pgids: list[int]) -> list[int]:
    alive = []
    for pgid in pgids:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            continue
        alive.append(pgid)
    return alive


def run_bench(
    argv: list[str], workdir: Path, env: dict[str, str], timeout: float
) -> tuple[int, str, list[int]]:
    """Run a benchmark runner that writes the process groups it starts to
    `<workdir>/pgids`; afterwards, whatever happened, SIGKILL every group still
    alive. Returns (exit status, output, groups that outlived the run)."""
    process = subprocess.Popen(
        [*argv, "--workdir", str(workdir)],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)  # the runner cleans up on SIGTERM
        with suppress(subprocess.TimeoutExpired):
            process.communicate(timeout=30)
        raise
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        path = workdir / "pgids"
        pgids = [int(n) for n in path.read_text().split()] if path.exists() else []
        deadline = time.monotonic() + 5
        while (left := groups_alive(pgids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pgid in left:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
    assert pgids, "the run started no processes"
    return process.returncode, output, left
