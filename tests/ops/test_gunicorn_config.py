"""The gunicorn settings `make run` and compose start the web with."""

import gc

from ledger import gunicorn


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
