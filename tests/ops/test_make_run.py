"""`make run` in embedded mode (no environment) starts and answers /healthz."""

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
EMBEDDED_UNSET = (
    "DATABASE_URL",
    "REDIS_URL",
    "CELERY_BROKER_URL",
    "DJANGO_SETTINGS_MODULE",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_make_run_serves_healthz_on_embedded_defaults(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in EMBEDDED_UNSET}
    env.update(LEDGER_DATA_DIR=str(tmp_path), PORT=str(port))
    log = (tmp_path / "run.log").open("w+")
    process = subprocess.Popen(
        ["make", "run"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so we can stop all of it
    )
    try:
        deadline = time.monotonic() + 90
        answer, output = None, ""
        # Ours is up when it has printed the demo logins and answers /healthz (a
        # port is only probed free, so checking the output too rules out a stranger).
        while time.monotonic() < deadline and process.poll() is None:
            log.seek(0)
            output = log.read()
            if '"token"' in output:
                try:
                    answer = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                    break
                except httpx.HTTPError:
                    pass
            time.sleep(0.5)
        assert answer is not None, f"never answered:\n{output[-3000:]}"
        assert answer.json() == {"status": "ok"}
        assert '"admin"' in output  # the admin login is printed too
        assert (tmp_path / "ledger.sqlite3").exists()  # SQLite, not PostgreSQL
    finally:
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C sends
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # anything that ignored it
        log.close()
