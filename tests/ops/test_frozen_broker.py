"""A Redis broker that accepts connections but never answers (a frozen redis-server,
a partition that drops packets without a reset): real beat and worker processes on a
redis-server of the test's own, stopped with SIGSTOP and resumed with SIGCONT.

Beat must log the failure and send its schedule again once the broker answers, not
wait on the socket until the kernel gives up; the worker, whose socket waits are
bounded the same way, must still consume between its BRPOP polls and recover; and
`make run` must refuse such a broker at start-up instead of hanging. Two beats on a
frozen broker: the leader keeps every try of a publish within its lease, so that the
other never sends while it still does.

The same on RabbitMQ (the machine's own, on a vhost of the test's: it is never
stopped), frozen for its clients by relays in front of it that pass nothing on: a
publish on a connection opened before the freeze ends within its bound, and two
beats never both send outside their leases.
"""

import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from amqp.exceptions import NotFound
from django.core.management.base import CommandError
from kombu import Connection
from kombu.exceptions import OperationalError

from idempotency.models import Lease
from ledger.broker import (
    RABBITMQ_SOCKET_TIMEOUT_SECONDS,
    REDIS_SOCKET_TIMEOUT_SECONDS,
    rabbitmq_transport_options,
    redis_transport_options,
)
from ledger.celery import app
from ledger.management.commands.serve import check_broker
from ledger.publishing import publish_within
from tests.helpers import wait_for
from tests.ops.test_beat_leader import start_beat, wait_for_log
from tests.payments.test_broker_outage import silent_broker
from tests.servers import rabbitmq_vhost, redis_server, stop
from tests.workers import celery_worker, point_producer_at, process_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PING_TASK = "idempotency.tasks.purge_expired_keys"  # cheap, and safe any time


@contextmanager
def frozen(process: subprocess.Popen) -> Iterator[None]:
    """The broker stopped (its socket still accepts), then resumed whatever happens."""
    os.kill(process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(process.pid, signal.SIGCONT)


def queued(url: str) -> int:
    return redis.Redis.from_url(url, socket_timeout=5).llen("celery")


class Relay:
    """A TCP relay in front of a server: `url` is the server's URL with the relay's
    port; `heard` the times (Unix seconds) at which a client sent anything through
    it; `cut()` drops every connection and refuses the next ones (a lost network);
    `frozen()` accepts connections and data and passes nothing on, either way, until
    it ends (the server frozen, for its clients behind this relay only)."""

    def __init__(self, url: str) -> None:
        self.upstream = urlsplit(url)
        self.listener = socket.create_server(("127.0.0.1", 0))
        port = self.listener.getsockname()[1]
        self.url = self.upstream._replace(
            netloc=self.upstream.netloc.replace(f":{self.upstream.port}", f":{port}")
        ).geturl()
        self.heard: list[float] = []
        self.held: list[socket.socket] = []
        self.is_cut = False
        self.flowing = threading.Event()
        self.flowing.set()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with suppress(OSError):
            while True:
                client = self.listener.accept()[0]
                if self.is_cut:
                    client.close()
                    continue
                server = socket.create_connection(
                    (self.upstream.hostname, self.upstream.port), timeout=5
                )
                server.settimeout(None)
                self.held.extend((client, server))
                for args in ((client, server, True), (server, client, False)):
                    threading.Thread(target=self._pipe, args=args, daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, record: bool) -> None:
        held = b""  # what came while frozen, passed on once it ends
        with suppress(OSError):
            while True:
                if select.select([source], [], [], 0.05)[0]:
                    if not (data := source.recv(65536)):
                        break
                    if record:
                        self.heard.append(time.time())
                    held += data
                if held and self.flowing.is_set():
                    sink.sendall(held)
                    held = b""
        for end in (source, sink):
            with suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.is_cut = True
        for end in self.held:
            with suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    @contextmanager
    def frozen(self) -> Iterator[None]:
        self.flowing.clear()
        try:
            yield
        finally:
            self.flowing.set()

    def close(self) -> None:
        self.flowing.set()
        self.listener.close()
        for end in self.held:
            with suppress(OSError):
                end.close()


@contextmanager
def relay(url: str) -> Iterator[Relay]:
    server = Relay(url)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def rabbitmq() -> Iterator[str]:
    """The URL of a vhost of this module's own on the machine's RabbitMQ."""
    with rabbitmq_vhost() as url:
        yield url


class FrozenBroker:
    """The broker of a test: a redis-server of its own (`server`), or the machine's
    RabbitMQ (no `server`), which `frozen()` freezes at the relays in front of it."""

    def __init__(self, url: str, server: subprocess.Popen | None) -> None:
        self.url = url
        self.server = server

    def frozen(self, relays: list[Relay]) -> AbstractContextManager:
        if self.server is not None:
            return frozen(self.server)
        stack = ExitStack()
        for each in relays:
            stack.enter_context(each.frozen())
        return stack

    def _queue(self, action: str) -> int:
        if self.server is not None:
            client = redis.Redis.from_url(self.url, socket_timeout=5)
            return (
                client.llen("celery") if action == "count" else client.delete("celery")
            )
        with Connection(
            self.url, transport_options=rabbitmq_transport_options()
        ) as connection:
            channel = connection.default_channel
            try:
                if action == "count":
                    return channel.queue_declare("celery", passive=True).message_count
                return channel.queue_purge("celery") or 0
            except NotFound:  # nothing sent yet
                return 0

    def forget_queue(self) -> None:
        """Delete the task queue and its exchange (a process on other settings
        declares them with other arguments)."""
        with Connection(
            self.url, transport_options=rabbitmq_transport_options()
        ) as connection:
            connection.default_channel.queue_delete("celery")
            connection.default_channel.exchange_delete("celery")

    def queued(self) -> int:
        return self._queue("count")

    def empty(self) -> None:
        self._queue("purge")


@pytest.fixture(params=["redis", "rabbitmq"])
def frozen_broker(request) -> Iterator[FrozenBroker]:
    if request.param == "redis":
        with redis_server() as (url, server):
            yield FrozenBroker(url, server)
    else:
        broker = FrozenBroker(request.getfixturevalue("rabbitmq"), None)
        broker.empty()
        yield broker


def test_beat_logs_a_frozen_broker_and_sends_again_once_it_answers(
    tmp_path, on_postgres
):
    with redis_server() as (url, server):
        beat = start_beat(tmp_path, "beat", CELERY_BROKER_URL=url)
        try:
            wait_for_log(tmp_path, "beat", "beat: leading")
            wait_for(lambda: queued(url) > 0, 30, "a task sent")
            log = tmp_path / "beat.log"
            with frozen(server):
                before = log.read_text()
                frozen_at = time.monotonic()
                # Without a socket timeout beat waits on the frozen broker silently.
                wait_for(
                    lambda: (
                        "Timeout reading from socket" in log.read_text()[len(before) :]
                    ),
                    10 * REDIS_SOCKET_TIMEOUT_SECONDS,
                    "beat logging the frozen broker",
                )
                assert time.monotonic() - frozen_at < 10 * REDIS_SOCKET_TIMEOUT_SECONDS
            redis.Redis.from_url(url, socket_timeout=5).delete("celery")
            wait_for(lambda: queued(url) > 0, 60, "a task sent after the resume")
            assert beat.poll() is None, log.read_text()
        finally:
            stop(beat)


@pytest.mark.parametrize("leader_loses_database", [False, True])
def test_two_beats_never_send_at_once_while_the_broker_is_frozen(
    tmp_path, on_postgres, frozen_broker, leader_loses_database
):
    """Each publish to a frozen broker fails after several tries, each one a socket
    timeout long: about a lease in all (as 25 s against 30 in production). Every
    try of each beat, seen at a relay of its own, falls within a lease it holds by
    the database's clock. The leader keeps the lead through the freeze while the
    database answers it; if it loses the database too, it stops trying before its
    lease ends and the other beat takes over. Whoever leads sends again once the
    broker answers."""
    beats: dict[str, subprocess.Popen] = {}
    url = frozen_broker.url
    with (
        relay(url) as broker_a,
        relay(url) as broker_b,
        relay(process_env()["DATABASE_URL"]) as database_a,
    ):
        relays = {"beat-a": broker_a, "beat-b": broker_b}
        try:
            beats["beat-a"] = start_beat(
                tmp_path,
                "beat-a",
                CELERY_BROKER_URL=broker_a.url,
                DATABASE_URL=database_a.url,
            )
            wait_for_log(tmp_path, "beat-a", "beat: leading")
            beats["beat-b"] = start_beat(
                tmp_path, "beat-b", CELERY_BROKER_URL=broker_b.url
            )
            wait_for_log(tmp_path, "beat-b", "beat: Starting...")
            wait_for(lambda: frozen_broker.queued() > 0, 30, "a task sent")

            leases: dict[str, tuple[float, float]] = {}  # holder: its lease, seen
            with frozen_broker.frozen([broker_a, broker_b]):
                since = time.time()
                while time.time() - since < 15:  # five leases
                    if leader_loses_database and time.time() - since > 2:
                        database_a.cut()
                    row = Lease.objects.get(name="beat")
                    acquired, _ = leases.get(row.holder, (0.0, 0.0))
                    leases[row.holder] = (
                        acquired or row.acquired_at.timestamp(),
                        row.expires_at.timestamp(),
                    )
                    time.sleep(0.02)
                until = time.time()

            sent = {
                name: [t for t in broker.heard if since <= t <= until]
                for name, broker in relays.items()
            }
            assert sent["beat-a"], "the leader did not try to send while frozen"
            outside = {
                name: [
                    t
                    for t in times
                    if not any(
                        holder.startswith(f"{name}:") and start <= t <= end
                        for holder, (start, end) in leases.items()
                    )
                ]
                for name, times in sent.items()
            }
            assert outside == {"beat-a": [], "beat-b": []}, (outside, leases)
            leader = "beat-b" if leader_loses_database else "beat-a"
            assert [h.partition(":")[0] for h in leases] == sorted({"beat-a", leader})
            if leader_loses_database:
                assert sent["beat-b"], "the new leader did not try to send"

            frozen_broker.empty()
            wait_for(
                lambda: frozen_broker.queued() > 0, 30, "a task sent after the resume"
            )
            assert Lease.objects.get(name="beat").holder.startswith(f"{leader}:")
            assert beats[leader].poll() is None, (
                tmp_path / f"{leader}.log"
            ).read_text()
        finally:
            for beat in beats.values():
                stop(beat)


def test_a_publish_to_a_frozen_rabbitmq_ends_within_its_bound(rabbitmq):
    """On a connection opened before the freeze, with production's RabbitMQ options
    (their socket timeouts ten times shorter, as beat's in these tests): a web
    request's publish (`ledger.publishing`) gives up at once, and one with Celery's
    retry policy (beat's, a worker's) raises after its four tries, where py-amqp
    waited for the broker's confirm for ever."""
    before = app.conf.broker_url
    # Declared on the test settings' plain exchange and queue, not the beats' own.
    broker = FrozenBroker(rabbitmq, None)
    broker.forget_queue()
    with relay(rabbitmq) as server:
        point_producer_at(server.url)
        app.conf.broker_transport_options = rabbitmq_transport_options(
            socket_timeout=0.5
        )
        try:
            assert publish_within(PING_TASK, ())
            app.send_task(PING_TASK, ignore_result=True)
            with server.frozen():
                started = time.monotonic()
                assert not publish_within(PING_TASK, ())
                assert time.monotonic() - started < 0.6

                ended: list[BaseException | None] = []

                def send() -> None:
                    try:
                        app.send_task(PING_TASK, ignore_result=True)
                    except BaseException as exc:  # looked at below
                        ended.append(exc)
                    else:
                        ended.append(None)

                started = time.monotonic()
                sender = threading.Thread(target=send, daemon=True)
                sender.start()
                sender.join(20 * 0.5)
                assert ended, "the publish still waits on the frozen broker"
                assert isinstance(ended[0], OperationalError), ended
        finally:
            point_producer_at(before)
            broker.forget_queue()


def test_the_worker_consumes_between_its_polls_and_after_a_freeze(
    tmp_path, on_postgres
):
    """The worker runs on the same bounded options: it still takes tasks between its
    idle BRPOP polls (1 s each) with no socket timeout in its log, and takes them
    again once a freeze longer than two socket timeouts ends."""
    with (
        redis_server() as (url, server),
        celery_worker(tmp_path, CELERY_BROKER_URL=url) as worker,
    ):
        log: Path = worker.log_path  # type: ignore[attr-defined]
        before = app.conf.broker_url
        point_producer_at(url)
        try:

            def run_one(seconds: float) -> None:
                done = log.read_text().count(" succeeded in ")
                app.send_task(PING_TASK)
                wait_for(
                    lambda: log.read_text().count(" succeeded in ") > done,
                    seconds,
                    "the task run",
                )

            # Idle for two polls or so between tasks, a dozen polls in all.
            started = time.monotonic()
            while time.monotonic() - started < 12:
                run_one(10)
                time.sleep(2.5)
            calm = log.read_text()
            assert "Timeout reading from socket" not in calm, calm
            assert "Connection to broker lost" not in calm, calm

            with frozen(server):
                time.sleep(2 * REDIS_SOCKET_TIMEOUT_SECONDS + 2)
            run_one(60)
            assert worker.poll() is None, log.read_text()
        finally:
            point_producer_at(before)


@pytest.mark.parametrize("scheme", ["redis", "amqp"])
def test_make_run_refuses_a_broker_that_accepts_and_never_answers(settings, scheme):
    """`serve` checks the broker with the settings' transport options (production's
    for the broker, whatever broker the test process was configured with)."""
    if scheme == "redis":
        settings.CELERY_BROKER_TRANSPORT_OPTIONS = redis_transport_options(
            visibility_timeout=3600
        )
        url, timeout = "redis://127.0.0.1:{port}/0", REDIS_SOCKET_TIMEOUT_SECONDS
    else:
        settings.CELERY_BROKER_TRANSPORT_OPTIONS = rabbitmq_transport_options()
        url = "amqp://guest:guest@127.0.0.1:{port}//"
        timeout = RABBITMQ_SOCKET_TIMEOUT_SECONDS
    with silent_broker() as port:
        started = time.monotonic()
        with pytest.raises(CommandError, match="does not answer"):
            check_broker(url.format(port=port))
    assert time.monotonic() - started < 4 * timeout
