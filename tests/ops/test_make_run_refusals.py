"""A setting that cannot work stops `make run` at once, with one line naming it."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ledger.management.commands.serve import check_port_free
from tests.ops.test_make_run import clean_path
from tests.servers import ROOT, free_port

pytestmark = pytest.mark.slow


def make_run(tmp_path: Path, port: int | str, **env: str) -> tuple[int, str]:
    environment = {
        "PATH": clean_path(),
        "HOME": os.environ.get("HOME", "/root"),
        "PORT": str(port),
        "LEDGER_DATA_DIR": str(tmp_path / "data"),
        **env,
    }
    result = subprocess.run(
        ["make", "run"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )
    return result.returncode, result.stdout + result.stderr


def refused(output: str, words: str) -> None:
    lines = [line for line in output.splitlines() if "CommandError" in line]
    assert len(lines) == 1 and words in lines[0], output[-3000:]
    assert "Traceback" not in output, output[-3000:]


def test_a_port_left_in_time_wait_by_the_last_run_is_free() -> None:
    """Ctrl-C, then `make run` again at once: the keep-alive connections the last
    run closed leave the port in TIME_WAIT for a minute; gunicorn binds it anyway,
    and so must the check before it."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        browser = socket.create_connection(("127.0.0.1", port))
        served, _ = listener.accept()
        served.close()  # the server closes first: its side waits in TIME_WAIT
        browser.close()
    check_port_free(port)


def test_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, output = make_run(tmp_path, port)
    assert code != 0
    refused(output, f"port {port} is in use")


@pytest.mark.parametrize("port", ["http", "99999", "0"])
def test_a_port_that_is_no_port(tmp_path: Path, port: str) -> None:
    code, output = make_run(tmp_path, port)
    assert code != 0
    refused(output, f"PORT='{port}' is not a port number")


# kombu's filesystem transport ignores the rest of the URL: any filesystem:// URL is
# the embedded broker, in LEDGER_DATA_DIR's broker folder.
@pytest.mark.parametrize("broker", [None, "filesystem://", "filesystem:///var/queue"])
def test_a_broker_folder_that_cannot_be_made(tmp_path: Path, broker: str | None):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "broker").write_text("a file where a folder belongs")
    env = {"CELERY_BROKER_URL": broker} if broker else {}
    code, output = make_run(tmp_path, free_port(), **env)
    assert code != 0
    refused(output, "broker")


def test_an_unusable_data_folder(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("a file where a folder belongs")
    code, output = make_run(tmp_path, free_port())
    assert code != 0
    refused(output, "LEDGER_DATA_DIR")


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("kafkaesque://127.0.0.1//", "unknown scheme 'kafkaesque'"),
        ("redis://127.0.0.1:{free port}/0", "does not answer"),
    ],
)
def test_a_broker_that_cannot_work(tmp_path: Path, url: str, words: str) -> None:
    # (the port is chosen when the test runs: every pytest-xdist worker must
    # collect the same tests)
    url = url.replace("{free port}", str(free_port()))
    code, output = make_run(tmp_path, free_port(), CELERY_BROKER_URL=url)
    assert code != 0
    refused(output, words)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("mysqlx://127.0.0.1/ledger", "DATABASE_URL has an unknown scheme 'mysqlx'"),
        ("postgres://postgres@127.0.0.1:port/ledger", "DATABASE_URL cannot be read"),
    ],
)
def test_a_database_url_that_cannot_work(tmp_path: Path, url: str, words: str) -> None:
    code, output = make_run(tmp_path, free_port(), DATABASE_URL=url)
    assert code != 0
    lines = [line for line in output.splitlines() if "DATABASE_URL" in line]
    assert len(lines) == 1 and words in lines[0], output[-3000:]
    assert "Traceback" not in output, output[-3000:]


@pytest.mark.parametrize(
    ("name", "value", "default"),
    [
        ("IDEMPOTENCY_TTL_SECONDS", "a day", 86400),
        ("IDEMPOTENCY_LEASE_SECONDS", "1.5", 30),
        ("HOLD_TTL_SECONDS", "7d", 604800),
    ],
)
def test_a_number_setting_that_is_no_number(
    tmp_path: Path, name: str, value: str, default: int
):
    """The settings are read before `serve` checks anything (`make run` runs the
    same command): a number that is none is one line naming it, no traceback."""
    assert serve_refusal(tmp_path, name, value) == [
        f"ImproperlyConfigured: {name}={value!r} is not a whole number: "
        f"leave it unset for {default}"
    ]


@pytest.mark.parametrize(
    ("name", "value", "takes", "default"),
    [
        ("HOLD_TTL_SECONDS", "59", "is outside 60..2592000", 604800),
        ("PREORDER_PURGE_AFTER_SECONDS", "60", "is below 600", 86400),
        ("PAYMENT_RECONCILE_BATCH", "0", "is below 1", 100),
    ],
)
def test_a_number_setting_out_of_its_range(
    tmp_path: Path, name: str, value: str, takes: str, default: int
):
    """Not the system checks' report of several lines: one line naming it."""
    [line] = serve_refusal(tmp_path, name, value)
    assert line.startswith(f"ImproperlyConfigured: {name}={value!r} {takes}: ")
    assert line.endswith(f", or leave it unset for {default}")


def serve_refusal(tmp_path: Path, name: str, value: str) -> list[str]:
    """The lines `manage.py serve` stops with when `name` is `value`."""
    result = subprocess.run(
        [sys.executable, "manage.py", "serve"],
        cwd=ROOT,
        env={
            "PATH": clean_path(),
            "HOME": os.environ.get("HOME", "/root"),
            "PORT": str(free_port()),
            "LEDGER_DATA_DIR": str(tmp_path / "data"),
            name: value,
        },
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Traceback" not in output, output[-3000:]
    return output.strip().splitlines()
