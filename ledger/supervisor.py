"""Run the processes of a Procfile together until Ctrl-C, as `make run` does.

Each process gets its own session, so the terminal's Ctrl-C reaches only this
supervisor, which then stops them in order: SIGTERM (gunicorn's graceful stop,
Celery's warm shutdown that returns unacknowledged messages to the broker), a wait,
and SIGKILL only for whatever is still running after `stop_timeout`. A second Ctrl-C
kills at once. When the supervisor itself dies, the kernel sends each child SIGTERM
(Linux's parent-death signal), so nothing outlives it; and when its own parent (make)
dies, the supervisor gets SIGTERM the same way and stops the stack.

On a terminal the supervisor also takes the foreground for itself: Ctrl-C then stops
the stack without also interrupting `make`, which ends with the supervisor's exit
status (0 for a normal stop) instead of "Error 130".
"""

import contextlib
import ctypes
import ctypes.util
import os
import random
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

PR_SET_PDEATHSIG = 1
# Looked up now, not in a child between fork and exec; None where there is no prctl.
_prctl = getattr(
    ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True), "prctl", None
)


def die_with_parent(signum: int = signal.SIGTERM) -> Callable[[], None]:
    """A `preexec_fn`: the kernel sends the child `signum` when the thread that
    started it ends, however it ends (Linux's parent-death signal; elsewhere, nothing).
    Hence processes meant to live as long as their starter are started from its
    main thread."""

    def arm() -> None:  # in the child, between fork and exec
        if _prctl is not None:
            _prctl(PR_SET_PDEATHSIG, signum)

    return arm


def stop_with_parent() -> None:
    """Have the kernel send this process SIGTERM when its parent dies.

    Under `make run` the parent is make: killed outright, or stopped by a SIGTERM
    that reaches make alone (`timeout`, a service manager, `kill <pid>`), it can no
    longer stop the stack, so the stack stops itself as on Ctrl-C instead of running
    on without anyone to stop it."""
    parent = os.getppid()
    die_with_parent(signal.SIGTERM)()
    if os.getppid() != parent:  # it died before we asked
        os.kill(os.getpid(), signal.SIGTERM)


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port that no server listens on, for one about to start.

    Chosen below the kernel's ephemeral range, not by binding port 0: a port the
    kernel hands out that way comes from that range, and until the server binds it,
    any outgoing connection (to PostgreSQL, to Redis) may take it as its own local
    end, and the server then fails to start with "address in use". Below the range
    only a listener's explicit bind takes a port, and this process hands out none
    twice (`claim`).
    """
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    first = max(1024, low // 2)
    below = low - first >= 1024  # (not when the range was tuned to start near 1024)
    for _ in range(1000):
        port = random.randrange(first, low) if below else _any_port()  # noqa: S311
        if claim(port):
            return port
    raise RuntimeError(f"no free port on 127.0.0.1 below {low}")


def claim(port: int) -> bool:
    """`port` is free and this process never handed it out: it is taken now."""
    if port in _handed_out or not bindable(port):
        return False
    _handed_out.add(port)
    return True


def _any_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def bindable(port: int) -> bool:
    """Nothing holds 127.0.0.1:`port`: a server could bind it now."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def read_procfile(path: Path) -> dict[str, str]:
    """`name: command` per line; blank lines and comments are skipped."""
    processes = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_-]+):\s*(.+)$", line.strip())
        if match:
            processes[match.group(1)] = match.group(2)
    return processes


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    buffer: bytes = b""


@dataclass
class Supervisor:
    commands: dict[str, str]
    env: dict[str, str]
    out: IO[str] = sys.stdout
    stop_timeout: float = 60
    children: list[Child] = field(default_factory=list)
    _stopping: int = 0  # how many stop signals arrived
    _exited: dict[str, int] = field(default_factory=dict)

    def start(self) -> None:
        width = max(map(len, self.commands))
        self._width = width
        for name, command in self.commands.items():
            process = subprocess.Popen(  # noqa: S603 - the project's own Procfile
                ["/bin/sh", "-c", f"exec {command}"],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(signal.SIGTERM),
            )
            os.set_blocking(process.stdout.fileno(), False)  # type: ignore[union-attr]
            self.children.append(Child(name, process))

    def say(self, name: str, line: str) -> None:
        self.out.write(f"{time.strftime('%H:%M:%S')} {name:<{self._width}} | {line}\n")
        self.out.flush()

    def lines(self, timeout: float) -> Iterator[tuple[str, str]]:
        """Pump every child's output for up to `timeout` seconds, yielding its lines."""
        selector = selectors.DefaultSelector()
        for child in self.children:
            pipe = child.process.stdout
            if pipe is not None and not pipe.closed:
                selector.register(pipe, selectors.EVENT_READ, child)
        if not selector.get_map():
            time.sleep(timeout)
            return
        try:
            for key, _ in selector.select(timeout):
                child = key.data
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:  # the process closed its output: it is ending
                    key.fileobj.close()  # type: ignore[union-attr]
                    continue
                child.buffer += chunk
                *complete, child.buffer = child.buffer.split(b"\n")
                for raw in complete:
                    line = raw.decode(errors="replace").rstrip("\r")
                    self.say(child.name, line)
                    yield child.name, line
        finally:
            selector.close()

    def install_signals(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._stopping += 1

    @property
    def stopping(self) -> bool:
        return self._stopping > 0

    def dead(self) -> Child | None:
        """The first child that exited although nobody asked it to."""
        for child in self.children:
            code = child.process.poll()
            if code is not None and child.name not in self._exited:
                self._exited[child.name] = code
                return child
        return None

    def run(self, on_line: Callable[[str, str], None]) -> int:
        """Serve until a stop signal (exit 0) or a child's death (exit 1)."""
        failed = None
        while not self.stopping:
            for name, line in self.lines(0.5):
                on_line(name, line)
            failed = self.dead()
            if failed:
                code = failed.process.returncode
                self.say("system", f"{failed.name} exited with status {code}")
                break
        self.stop()
        return 1 if failed else 0

    def stop(self) -> None:
        self.say("system", "stopping: SIGTERM to every process, then waiting")
        for child in self.children:
            if child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGTERM)
        first_signal = self._stopping
        deadline = time.monotonic() + self.stop_timeout
        while any(c.process.poll() is None for c in self.children):
            for _ in self.lines(0.2):
                pass
            if time.monotonic() > deadline or self._stopping > max(first_signal, 1):
                self.say("system", "still running: SIGKILL")
                break
        for child in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.process.pid, signal.SIGKILL)  # and anything it left
            child.process.wait()
        for _ in self.lines(0):
            pass
        for child in self.children:
            self.say("system", f"{child.name} stopped")


@contextlib.contextmanager
def terminal_foreground() -> Iterator[None]:
    """Make this process the terminal's foreground group while the block runs.

    Ctrl-C then reaches this process only, not `make` above it. Does nothing when
    there is no terminal or we are not in its foreground (a background job, a test).
    """
    try:
        tty = os.open("/dev/tty", os.O_RDWR)
    except OSError:
        yield
        return
    previous = os.getpgrp()
    taken = False
    try:
        if os.tcgetpgrp(tty) == previous:
            os.setpgid(0, 0)
            _tcsetpgrp_quietly(tty, os.getpgrp())
            taken = True
    except OSError:
        pass
    try:
        yield
    finally:
        if taken:
            with contextlib.suppress(OSError):
                _tcsetpgrp_quietly(tty, previous)
        os.close(tty)


def _tcsetpgrp_quietly(tty: int, group: int) -> None:
    """tcsetpgrp from a group that may be in the background (which would SIGTTOU)."""
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(tty, group)
    finally:
        signal.signal(signal.SIGTTOU, old)
