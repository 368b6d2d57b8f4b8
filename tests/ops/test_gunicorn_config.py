"""The gunicorn settings `make run` and compose start the web with."""

import gc

import pytest

from ledger import gunicorn as settings
from tests.servers import gunicorn


def test_a_worker_hides_what_it_loaded_from_the_collector():
    """After the app and its URLs are loaded, the worker freezes them: a collection
    of the oldest generation no longer walks the objects that live as long as the
    process."""
    gc.unfreeze()
    try:
        settings.post_worker_init(worker=None)
        frozen = gc.get_freeze_count()
        from orders import apis  # a view module the URLs import

        assert frozen > 50_000
        assert gc.is_tracked(apis.OrderCreateApi)
        # frozen: a collection no longer sees it
        assert all(o is not apis.OrderCreateApi for o in gc.get_objects())
    finally:
        gc.unfreeze()


@pytest.mark.slow
def test_gunicorn_started_as_make_run_does_opens_no_control_socket(tmp_path):
    """gunicorn's default control socket lives in $HOME (or $XDG_RUNTIME_DIR); the
    project's settings turn it off, so a master runs no thread of its own beside
    its workers and two gunicorns of one user do not take the path from each other."""
    home = {"HOME": str(tmp_path), "XDG_RUNTIME_DIR": ""}  # ("": not set)
    with gunicorn(tmp_path, "ledger.settings", **home) as (url, _):
        assert not (tmp_path / ".gunicorn").exists()
        log = tmp_path / f"gunicorn-{url.rsplit(':', 1)[1]}.log"
        assert "Control socket" not in log.read_text()
