"""`manage.py serve` (what `make run` runs) with stand-ins for the Procfile's processes.

The stand-ins say only what the real ones say to be counted as started, then nothing
more: what `serve` prints or does after that cannot rely on a later line to push it
out. Embedded mode (SQLite in a temporary data folder), no services.
"""

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger.supervisor import bindable
from tests.servers import ROOT, free_port

pytestmark = pytest.mark.slow

QUIET_WEB = """
import http.server, sys

class Quiet(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Quiet).serve_forever()
"""


def procfile(tmp_path: Path) -> Path:
    (tmp_path / "web.py").write_text(QUIET_WEB)
    path = tmp_path / "Procfile"
    path.write_text(
        f"web: python {tmp_path / 'web.py'} $PORT\n"
        "worker: sh -c 'sleep 1; echo \"celery@test ready.\"; exec sleep 600'\n"
        "beat: sh -c 'sleep 1; echo \"beat: Starting...\"; exec sleep 600'\n"
    )
    return path


def descendants(pid: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def alive(pids: set[int]) -> set[int]:
    """Those still running (a zombie has ended: only its parent has yet to reap it)."""
    running = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z":
                running.add(pid)
    return running


def wait_for(text: str, log: Path, process: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        assert process.poll() is None, log.read_text(errors="replace")[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never came:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data folder for the module's runs of serve: the first migrates its SQLite
    database and seeds the demo, the next starts on them as a second `make run` does
    (no test here is about a first start)."""
    return tmp_path_factory.mktemp("serve") / "data"


@contextlib.contextmanager
def serving(
    tmp_path: Path, data_dir: Path, parent_shell: bool = False
) -> Iterator[tuple]:
    """`manage.py serve` with its output in a file (not a terminal), either
    directly or as the child of a shell that stays its parent (as under make)."""
    log = tmp_path / "serve.log"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "PORT": str(free_port()),
        "LEDGER_DATA_DIR": str(data_dir),
    }
    command = [sys.executable, "manage.py", "serve"]
    command += ["--procfile", str(procfile(tmp_path))]
    if parent_shell:
        command = ["/bin/sh", "-c", '"$@"; echo "the shell goes on"', "sh", *command]
    with log.open("w") as out:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process, log
    finally:
        for pid in alive(descendants(process.pid) | {process.pid}):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)


def test_the_banner_ends_the_start_up_output_even_when_nothing_follows_it(
    tmp_path, data_dir
):
    with serving(tmp_path, data_dir) as (process, log):
        wait_for("Ctrl-C stops everything.", log, process, seconds=120)
        text = log.read_text()
        assert re.search(r"API token\s+[0-9a-f]{40}", text), text[-2000:]
        # Only the processes' prefixed lines and the block: no log line of serve's own
        # (its /healthz probe) in between.
        assert '"logger": "httpx"' not in text, text[-2000:]
        stack = descendants(process.pid)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, log.read_text()[-3000:]
        assert not alive(stack), log.read_text()[-3000:]


def test_the_stack_stops_when_what_started_serve_is_killed(tmp_path, data_dir):
    """make (or the shell under it) killed outright, or stopped by a SIGTERM that
    reaches only make, as `timeout`, a service manager or `kill <pid>` send it: serve
    stops its processes warmly instead of running on without a parent."""
    with serving(tmp_path, data_dir, parent_shell=True) as (shell, log):
        wait_for("Ctrl-C stops everything.", log, shell, seconds=120)
        stack = descendants(shell.pid)
        assert len(stack) >= 4, stack  # serve, web, worker, beat
        os.kill(shell.pid, signal.SIGKILL)
        shell.wait(timeout=10)
        deadline = time.monotonic() + 60
        while alive(stack) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(stack), log.read_text()[-3000:]
        assert "stopping: SIGTERM to every process" in log.read_text()


def test_the_provider_simulator_gets_a_port_of_its_own_unless_one_is_set(monkeypatch):
    from ledger.management.commands.serve import child_env

    for name in ("PAYMENT_PROVIDER_URL", "PROVIDER_PUBLIC_URL"):
        monkeypatch.setenv(name, "")  # set to nothing counts as unset
    env = child_env(8000, 41234)
    assert env["PROVIDER_PORT"] == "41234"
    assert env["PAYMENT_PROVIDER_URL"] == "http://127.0.0.1:41234/provider"
    assert env["PROVIDER_PUBLIC_URL"] == "http://127.0.0.1:8000"  # the pay page
    monkeypatch.setenv("PAYMENT_PROVIDER_URL", "https://provider.example/api")
    assert child_env(8000, 41234)["PAYMENT_PROVIDER_URL"] == (
        "https://provider.example/api"
    )
    monkeypatch.delenv("PAYMENT_PROVIDER_URL")
    monkeypatch.delenv("PROVIDER_PUBLIC_URL")
    bare = child_env(8000)  # a Procfile without the simulator: nothing set
    assert "PROVIDER_PORT" not in bare and "PAYMENT_PROVIDER_URL" not in bare


def test_a_free_port_is_one_no_connection_can_take_and_nobody_holds(monkeypatch):
    """Below the ephemeral range, which outgoing connections draw their local ports
    from; never one a listener holds, never one handed out before."""
    from ledger import supervisor

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    given = free_port()
    assert low // 2 <= given < low
    unused = [p for p in range(low // 2, low) if p not in supervisor._handed_out]
    with contextlib.ExitStack() as stack:
        held = stack.enter_context(socket.socket())
        for port in unused:
            with contextlib.suppress(OSError):
                held.bind(("127.0.0.1", port))
                break
        held.listen()
        held_port = held.getsockname()[1]
        fresh = next(p for p in unused if p > held_port and bindable(p))
        draws = iter([given, held_port, fresh])
        monkeypatch.setattr(supervisor.random, "randrange", lambda *_: next(draws))
        assert free_port() == fresh


def test_a_range_tuned_to_start_near_1024_still_gives_a_free_port(
    monkeypatch, tmp_path
):
    from ledger import supervisor

    tuned = tmp_path / "ip_local_port_range"
    tuned.write_text("1024\t65535\n")
    monkeypatch.setattr(supervisor, "_EPHEMERAL_RANGE", tuned)
    port = free_port()
    assert port >= 1024 and bindable(port)
