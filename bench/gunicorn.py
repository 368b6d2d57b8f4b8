"""gunicorn settings of the benchmark's servers: the project's own
(`ledger/gunicorn.py`, as `make run` and compose start gunicorn), but for the
access log, a line a request that would cost every scenario alike and so narrow
the gaps the benchmark measures."""

from ledger.gunicorn import child_exit, control_socket_disable, post_worker_init

__all__ = ("accesslog", "child_exit", "control_socket_disable", "post_worker_init")

accesslog = None
