"""A test run leaves no process behind (`tests.reaper`): one a test forgot fails the
run, and everything the tests started dies with a run that was killed.

Each case runs pytest on a small test file, with this suite's own conftest, as
`make test` runs it."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reaper import MARK
from tests.servers import ROOT, wait_for_port

pytestmark = pytest.mark.slow

LEAVES_AN_ORPHAN = """
import shlex, subprocess, time
from tests.servers import free_port, redis_command

def test_leaves_a_redis_behind():
    port = free_port()
    # The shell that starts it exits: redis-server lives on with no parent of the
    # run's, and its process title written over the environment that marked it.
    starter = f"{{shlex.join(redis_command(port))}} > /dev/null & sleep 1.2"
    subprocess.Popen(["sh", "-c", starter], start_new_session=True)
    open({port_file!r}, "w").write(str(port))
    time.sleep(2.5)
"""

DIES_WITH_A_GUNICORN_RUNNING = """
import os, signal
from tests.servers import gunicorn

def test_killed_mid_way(tmp_path):
    with gunicorn(tmp_path, "ledger.settings.test", workers=2) as (url, _):
        open({port_file!r}, "w").write(url.rsplit(":", 1)[1])
        os.kill(os.getpid(), signal.SIGKILL)  # as a timeout or the OOM killer would
"""


def inner_run(tmp_path: Path, source: str) -> tuple[subprocess.CompletedProcess, int]:
    """pytest on `source`, with tests/conftest.py's hooks; (its outcome, the port
    the test wrote down for the server it started)."""
    port_file = tmp_path / "port"
    test_file = tmp_path / "test_inner.py"
    test_file.write_text(source.format(port_file=str(port_file)))
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa\n")
    environment = {k: v for k, v in os.environ.items() if k != MARK}
    config = ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT)]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *config, str(test_file)],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert port_file.exists(), done.stdout + done.stderr
    return done, int(port_file.read_text())


def answers(port: int, seconds: float) -> bool:
    """Does something still listen on `port` at the end of `seconds`?"""
    time.sleep(seconds)
    return wait_for_port(port, 0.5)


def test_a_process_a_test_left_running_fails_the_run_and_is_killed(tmp_path):
    done, port = inner_run(tmp_path, LEAVES_AN_ORPHAN)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    assert "processes the tests left running (killed now)" in done.stderr
    assert "redis-server" in done.stderr
    assert not answers(port, 0)


def test_servers_die_with_a_killed_run(tmp_path):
    done, port = inner_run(tmp_path, DIES_WITH_A_GUNICORN_RUNNING)
    assert done.returncode == -9, done.stdout + done.stderr
    # the watcher looks for its run every half second, then kills what is marked
    assert not answers(port, 3), "gunicorn outlived the run that started it"
