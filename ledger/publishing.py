"""Publishing a task from a web request, with a bounded wait on the broker.

A web request sends its tasks after its commit (`payments.services.enqueue_on_commit`):
the rows they act on are already durable, and beat re-drives every task that was not
sent. So the request should not wait on a broker that is down. With Celery's and
kombu's defaults it did: 0.6 s per task when the broker refused connections (the
default publish retry policy's sleeps), 4 to 17 s when it dropped packets (kombu
retries connecting for `broker_connection_timeout`), and minutes when a connection it
held went silent (no socket timeout at all, until the kernel gives up).

- **A bounded wait.** Every socket wait of a publish (connect, handshake, send, the
  broker's confirm) is bounded by `CELERY_PUBLISH_TIMEOUT_SECONDS` (0.25 s), nothing
  sleeps, and only a quick failure (a connection the broker closed meanwhile) is
  retried, once, at once. The producers have a connection pool of their own, so the
  worker and beat keep Celery's retry policy (their socket waits on a Redis broker
  are bounded too, by `ledger.broker.redis_transport_options`, 5 s each).
- **No result asked for.** A task sent here is never waited on: its result is not
  stored, and this process subscribes to nothing, whatever result backend is set.
- **One pool of connections, held here.** kombu's global pools are found by a hash of
  the connection's transport options, which each publish with a retry policy updates
  (`Producer.publish` merges the policy in, with its per-call errback): looked up
  there, every publish could miss, open a pool and a connection of its own, and keep
  both for the life of the process (115 KB a payment, measured under gunicorn).
- **A short break after a failure.** For `CELERY_PUBLISH_BREAK_SECONDS` (5 s) after a
  publish failed, this process sends nothing and waits on nothing: the tasks of the
  requests meanwhile are left to beat's re-drive at once. Logged, and counted in
  `celery_publishes_total{task, outcome}` (`sent`, `failed`, `skipped`).
"""

import logging
import os
import threading
import time
from typing import Any

from celery import current_app
from django.conf import settings
from kombu import pools
from kombu.pools import ProducerPool

from ledger.metrics import celery_publishes

logger = logging.getLogger(__name__)


class _Publishing:
    """This process's producers on their bounded connections, and the end of its
    break."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.key: tuple | None = None
        self.producers: ProducerPool | None = None
        self.paused_until = 0.0  # time.monotonic()


_publishing = _Publishing()


def bounded_transport_options(url: str, timeout: float) -> dict[str, Any]:
    """Transport options that bound every socket wait of a publish to `timeout`."""
    # One connection attempt per try: kombu otherwise keeps trying to connect for
    # `broker_connection_timeout` (4 s), whatever the publish retry policy says.
    options: dict[str, Any] = {"max_retries": 0}
    scheme = url.partition(":")[0]
    if scheme in {"redis", "rediss", "sentinel"}:
        options |= {"socket_connect_timeout": timeout, "socket_timeout": timeout}
    elif scheme in {"amqp", "amqps", "pyamqp"}:
        # Connecting and the handshake wait `connect_timeout` (the settings' own,
        # merged in under these, would win over a keyword); the others bound a
        # silent socket.
        options |= {
            "connect_timeout": timeout,
            "read_timeout": timeout,
            "write_timeout": timeout,
        }
    return options


def _broker_key(timeout: float) -> tuple:
    app = current_app
    url = app.conf.broker_write_url or app.conf.broker_url
    return (url, timeout, repr(sorted(app.conf.broker_transport_options.items())))


def _producers(key: tuple) -> ProducerPool:
    url, timeout, _ = key
    with _publishing.lock:
        if _publishing.producers is None or _publishing.key != key:
            # Another broker (tests point the producer elsewhere): a fresh start.
            if _publishing.producers is not None:
                _publishing.producers.connections.force_close_all()
            connection = current_app.connection_for_write(
                connect_timeout=timeout,
                transport_options=bounded_transport_options(url, timeout),
            )
            limit = pools.get_limit()
            _publishing.producers = ProducerPool(connection.Pool(limit), limit=limit)
            _publishing.key = key
            _publishing.paused_until = 0.0
        return _publishing.producers


def _forget_after_fork() -> None:
    """A forked child opens connections of its own (as kombu's pools are reset)."""
    global _publishing
    _publishing = _Publishing()


os.register_at_fork(after_in_child=_forget_after_fork)


def publish_within(name: str, args: tuple) -> bool:
    """Send the task `name` now, waiting on the broker about
    `CELERY_PUBLISH_TIMEOUT_SECONDS` a step at most; True if the broker took it.

    For a web request after its commit, whose rows beat re-drives: a failure is
    logged and counted, never raised, and for `CELERY_PUBLISH_BREAK_SECONDS` after
    it this process skips publishing at once instead of waiting again.
    """
    timeout = float(settings.CELERY_PUBLISH_TIMEOUT_SECONDS)
    key = _broker_key(timeout)
    if _publishing.key == key and time.monotonic() < _publishing.paused_until:
        celery_publishes.labels(task=name, outcome="skipped").inc()
        logger.warning(
            "broker unavailable: %s%r not sent; beat will re-drive", name, args
        )
        return False
    started = time.monotonic()

    def once_if_quick(exc: BaseException, _interval: float) -> None:
        if time.monotonic() - started >= timeout:
            raise exc  # slow: a broker that does not answer, not a stale socket

    policy = {
        "max_retries": 1,
        "interval_start": 0,
        "interval_step": 0,
        "interval_max": 0,
        "errback": once_if_quick,
    }
    try:
        with _producers(key).acquire(block=True, timeout=timeout) as producer:
            current_app.send_task(
                name,
                args=args,
                producer=producer,
                retry=True,
                retry_policy=policy,
                timeout=timeout,
                confirm_timeout=timeout,
                # Nothing waits for a task's result. Not told so, Celery would
                # subscribe this process to the result of every task it sent
                # wherever a result backend is set (Redis: a channel each).
                ignore_result=True,
            )
    except Exception:  # kombu raises many kinds; none may undo a commit
        pause = settings.CELERY_PUBLISH_BREAK_SECONDS
        _publishing.paused_until = time.monotonic() + pause
        celery_publishes.labels(task=name, outcome="failed").inc()
        logger.exception(
            "could not send %s%r in %.2f s; none sent for %s s, beat will re-drive",
            name,
            args,
            time.monotonic() - started,
            pause,
        )
        return False
    celery_publishes.labels(task=name, outcome="sent").inc()
    return True
