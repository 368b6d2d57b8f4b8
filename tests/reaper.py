"""Nothing the tests start outlives the test run, however the run ends.

A process belongs to the run when it descends from the run's process (pytest), or
carries the run's mark in its environment (`LEDGER_TEST_RUN`, set before the first
test and inherited by whatever a test starts, also after it detached itself), or
descends from one that does. Two checks use that:

- when the session finishes, a process of the run still alive is one a test left
  behind: the run fails and names it (`stragglers`), after killing it;
- a watcher process, started with the session in a session of its own, looks at
  the run's processes twice a second; once the run's process is gone, however it
  went (an uncaught error, SIGKILL from a timeout, Ctrl-C twice), it SIGKILLs every
  process of the run it last saw and every one still carrying the mark.

(The mark alone would not do: a server that sets its process title, redis-server
for one, writes over the environment the kernel shows; the ancestry alone would
not either: a process whose parent died no longer descends from the run.)
"""

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

MARK = "LEDGER_TEST_RUN"
_watcher: subprocess.Popen | None = None

WATCHER = r"""
import os, sys, time
sys.path.insert(0, sys.argv[2])
from tests.reaper import kill, of_run
run, mark, seen = int(sys.argv[1]), os.environ["WATCHED_RUN"], {}
while os.getppid() == run:  # (reparented once the run is gone)
    seen = of_run(run, mark)
    time.sleep(0.5)
kill(run, mark, seen)
"""


def start() -> None:
    """Mark this run and start its watcher (once per process)."""
    global _watcher
    if _watcher is not None:
        return
    os.environ[MARK] = mark = uuid.uuid4().hex
    environment = {k: v for k, v in os.environ.items() if k != MARK}
    root = str(Path(__file__).resolve().parents[1])
    _watcher = subprocess.Popen(
        [sys.executable, "-c", WATCHER, str(os.getpid()), root],
        env={**environment, "WATCHED_RUN": mark},
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def processes() -> dict[int, tuple[int, str]]:
    """Every live process: pid -> (parent pid, start time); not zombies."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # gone
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            found[int(entry)] = (int(fields[1]), fields[19])
    return found


def carries(pid: int, mark: str) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or not ours to read
        return False
    return f"{MARK}={mark}".encode() in environ.split(b"\0")


def of_run(
    run: int, mark: str, seen: dict[int, str] | None = None, spare: int | None = None
) -> dict[int, str]:
    """The run's live processes, not the run itself, the caller or `spare`: pid ->
    start time. `seen` adds processes seen before, if they still are the same ones."""
    table, seen = processes(), seen or {}
    roots = {run} | {
        pid
        for pid, (_, started) in table.items()
        if seen.get(pid) == started or carries(pid, mark)
    }
    found: dict[int, str] = {}
    changed = True
    while changed:  # down the tree from the roots
        changed = False
        for pid, (parent, started) in table.items():
            if pid not in found and (pid in roots or parent in found):
                found[pid] = started
                changed = True
    return {
        pid: started
        for pid, started in found.items()
        if pid not in (run, os.getpid(), spare)
    }


def describe(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"{pid} (gone)"
    return f"{pid} {b' '.join(argv).decode(errors='replace').strip()[:200]}"


def kill(
    run: int, mark: str, seen: dict[int, str], spare: int | None = None
) -> list[str]:
    """SIGKILL the run's processes and those in `seen`, again until none is left
    (a master may fork a new worker between two looks); return what was killed."""
    killed: list[str] = []
    for _ in range(20):
        left = of_run(run, mark, seen, spare)
        if not left:
            break
        for pid in left:
            killed.append(describe(pid))
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        seen = {**seen, **left}
        time.sleep(0.1)
    return killed


def stragglers(grace: float = 5.0) -> list[str]:
    """What the tests left running at the end of the session, after `grace`
    seconds for processes that are stopping to exit; killed before returning."""
    if _watcher is None:
        return []
    run, mark, spare = os.getpid(), os.environ[MARK], _watcher.pid
    deadline = time.monotonic() + grace
    while (left := of_run(run, mark, spare=spare)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return kill(run, mark, left, spare) if left else []
