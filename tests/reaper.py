"""Nothing the tests start outlives the test run, however the run ends.

A process belongs to the run when it descends from the run's process (pytest), or
carries the run's mark in its environment (`LEDGER_TEST_RUN`, set before the first
test and inherited by whatever a test starts, also after it detached itself), or
was seen as one of those before (by its pid and start time), or descends from one
that does. A watcher process, started with the session in a session of its own,
looks at the run's processes twice a second and writes down what it saw. Two checks
use that:

- when the session has finished (its fixtures torn down), a process of the run still
  alive is one a test left behind: the run fails and names it (`stragglers`), after
  killing it;
- once the run's process is gone, however it went (an uncaught error, SIGKILL from a
  timeout, Ctrl-C twice), the watcher SIGKILLs every process of the run.

(The mark alone would not do: a server that sets its process title, redis-server for
one, writes over the environment the kernel shows; the ancestry alone would not
either: a process whose parent died no longer descends from the run.) Containers
are the docker engine's, not the run's: the compose test removes its own.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

MARK = "LEDGER_TEST_RUN"
_watcher: subprocess.Popen | None = None
_seen_file: Path | None = None

WATCHER = r"""
import os, sys, time
sys.path.insert(0, sys.argv[2])
from tests.reaper import kill, of_run, write_seen
run, seen_file, seen = int(sys.argv[1]), sys.argv[3], {}
mark = os.environ["WATCHED_RUN"]
while os.getppid() == run:  # (reparented once the run is gone)
    seen = of_run(run, mark, seen)
    write_seen(seen_file, seen)
    time.sleep(0.5)
kill(None, mark, seen)  # (the run's pid is free now: another process may get it)
os.unlink(seen_file)
"""


def start() -> None:
    """Mark this run and start its watcher (once per process)."""
    global _watcher, _seen_file
    if _watcher is not None:
        return
    os.environ[MARK] = mark = uuid.uuid4().hex
    environment = {k: v for k, v in os.environ.items() if k != MARK}
    root = str(Path(__file__).resolve().parents[1])
    _seen_file = Path(tempfile.gettempdir()) / f"ledger-test-run-{mark}.json"
    _watcher = subprocess.Popen(
        [sys.executable, "-c", WATCHER, str(os.getpid()), root, str(_seen_file)],
        env={**environment, "WATCHED_RUN": mark},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,  # (holding the run's output open would keep a
        stderr=subprocess.DEVNULL,  # reader of it waiting for the watcher's end)
        start_new_session=True,
    )


def write_seen(path: str, seen: dict[int, str]) -> None:
    partial = f"{path}.partial"
    Path(partial).write_text(json.dumps(seen))
    os.replace(partial, path)


def read_seen() -> dict[int, str]:
    if _seen_file is None:
        return {}
    try:
        return {
            int(pid): started
            for pid, started in json.loads(_seen_file.read_text()).items()
        }
    except (OSError, ValueError):
        return {}


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
    run: int | None,
    mark: str,
    seen: dict[int, str] | None = None,
    spare: int | None = None,
) -> dict[int, str]:
    """The run's live processes, not the run itself, the caller or `spare`: pid ->
    start time. `seen`: processes of the run seen before, which still are if the
    same process still has the pid."""
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
    run: int | None, mark: str, seen: dict[int, str], spare: int | None = None
) -> list[str]:
    """SIGKILL the run's processes and those in `seen`, again until none is left
    (a master may fork a new worker between two looks); return what was killed."""
    killed: dict[int, str] = {}
    for _ in range(20):
        left = of_run(run, mark, seen, spare)
        if not left:
            break
        for pid in left:
            killed.setdefault(pid, describe(pid))
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        seen = {**seen, **left}
        time.sleep(0.1)
    return list(killed.values())


def stragglers(grace: float = 5.0) -> list[str]:
    """What the tests left running at the end of the session, after `grace`
    seconds for processes that are stopping to exit; killed before returning."""
    if _watcher is None:
        return []
    run, mark, spare = os.getpid(), os.environ[MARK], _watcher.pid
    deadline = time.monotonic() + grace
    while (
        left := of_run(run, mark, read_seen(), spare)
    ) and time.monotonic() < deadline:
        time.sleep(0.2)
    return kill(run, mark, left, spare) if left else []
