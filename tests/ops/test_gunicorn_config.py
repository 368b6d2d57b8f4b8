"""The gunicorn settings `make run` and compose start the web with."""

import gc
import os
import subprocess

import pytest

from ledger import gunicorn
from tests.servers import ROOT, free_port, stop, wait_until_up


def test_a_worker_hides_what_it_loaded_from_the_collector():
    """After the app and its URLs are loaded, the worker freezes them: a collection
    of the oldest generation no longer walks the objects that live as long as the
    process."""
    gc.unfreeze()
    try:
        gunicorn.post_worker_init(worker=None)
        frozen = gc.get_freeze_count()
        from orders import apis  # a view module the URLs import

        assert frozen > 50_000
        assert gc.is_tracked(apis.OrderCreateApi)
        # frozen: a collection no longer sees it
        assert all(o is not apis.OrderCreateApi for o in gc.get_objects())
    finally:
        gc.unfreeze()


@pytest.mark.slow
def test_gunicorn_started_with_the_settings_opens_no_control_socket(tmp_path):
    """gunicorn's default control socket lives in $HOME (or $XDG_RUNTIME_DIR); the
    project's settings turn it off, so a master runs no thread of its own beside
    its workers and two gunicorns of one user do not take the path from each other."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env["HOME"] = str(tmp_path)
    log = tmp_path / "gunicorn.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                str(ROOT / ".venv/bin/gunicorn"),
                "ledger.wsgi",
                "--config",
                "python:ledger.gunicorn",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                "1",
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until_up(f"http://127.0.0.1:{port}", process, 1, log)
        assert not (tmp_path / ".gunicorn").exists()
        assert "Control socket" not in log.read_text()
    finally:
        stop(process)
