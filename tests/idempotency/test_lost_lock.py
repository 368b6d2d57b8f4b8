"""A key whose Redis lock is lost while its first request still runs.

Request A pays order X with key K and is slow: another transaction holds X's row. Its
Redis lock goes away meanwhile (the lease runs out, or the cache Redis restarts). B
then pays order Y with the same K. The database must still see that A runs: B never
executes, A pays X, and every retry of B is refused as a reuse of A's key.
"""

import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from django.db import connection
from rest_framework.test import APIClient

from idempotency import engine
from idempotency.redis import get_redis
from ledger.services import merchant_account
from orders.models import Order
from payments.models import Payment
from tests.conftest import Background
from tests.helpers import assert_problem, customer, new_key, place_order
from tests.servers import free_port, redis_command, stop, wait_for_port

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("tests.idempotency.urls"),
    pytest.mark.usefixtures("on_postgres"),
]


class OwnRedis:
    """A redis-server of our own on a free loopback port, to restart at will."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            redis_command(self.port), stdout=subprocess.DEVNULL, start_new_session=True
        )
        assert wait_for_port(self.port), "redis-server did not start"

    def restart(self) -> None:
        """Kill it and start an empty one on the same port; the app's client then
        reconnects (its pooled connections to the old server are dropped)."""
        assert self.process is not None
        stop(self.process)
        self.start()
        client = get_redis()
        assert client is not None
        client.connection_pool.disconnect()

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)


@pytest.fixture
def own_redis(settings) -> Iterator[OwnRedis]:
    redis = OwnRedis()
    redis.start()
    settings.REDIS_URL = redis.url
    try:
        yield redis
    finally:
        redis.stop()


@contextmanager
def row_locked(table: str, pk: int) -> Iterator[None]:
    """Hold a row's lock from another connection, as a slow neighbour would."""
    db = connection.settings_dict
    with psycopg.connect(
        dbname=db["NAME"], user=db["USER"], host=db["HOST"], port=db["PORT"]
    ) as outside:
        outside.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE", [pk])  # noqa: S608
        try:
            yield
        finally:
            outside.rollback()


def wait_until_blocked() -> None:
    """Until some backend of the test database waits for a lock."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                return
        time.sleep(0.05)
    raise AssertionError("the request never blocked on the row lock")


def token_client(client: APIClient) -> APIClient:
    """Another client with the same credentials (test clients are not thread-safe)."""
    other = APIClient()
    other.credentials(**client._credentials)  # type: ignore[attr-defined]
    return other


def pay(client: APIClient, order: Order, key: str, method: str = "balance"):
    return client.post(
        f"/api/v1/orders/{order.merchant_order_no}/pay",
        {"method": method},
        format="json",
        headers={"Idempotency-Key": key},
    )


@pytest.mark.parametrize("loss", ["lease expired", "redis restarted"])
def test_a_lost_redis_lock_never_lets_a_reused_key_run(own_redis, settings, loss):
    if loss == "lease expired":
        settings.IDEMPOTENCY_LEASE_SECONDS = 1
    user, client, _ = customer("alice", balance=10_000)
    merchant_account(currency="CNY")
    x, y = place_order(user), place_order(user)
    key = new_key()
    with row_locked(Order._meta.db_table, x.pk):
        first = Background(lambda: pay(token_client(client), x, key))
        first.start()
        wait_until_blocked()  # A runs: its transaction waits for X's row
        if loss == "lease expired":
            time.sleep(1.5)
        else:
            own_redis.restart()
        second = pay(client, y, key)
        assert_problem(second, 409, "idempotency_key_in_flight")
        assert int(second["Retry-After"]) >= 1
    a = first.outcome()
    assert not isinstance(a, Exception), a
    assert a.status_code == 201, a.content
    assert Order.objects.get(pk=x.pk).status == Order.Status.PAID
    assert Order.objects.get(pk=y.pk).status == Order.Status.PENDING_PAYMENT
    assert not Payment.objects.filter(order=y).exists()
    # Every retry of B is told the key belongs to A's request; A's retry replays.
    assert_problem(pay(client, y, key), 422, "idempotency_key_reused")
    again = pay(client, x, key)
    assert again.content == a.content and again["Idempotent-Replayed"] == "true"


def test_a_phased_request_never_runs_under_a_key_an_atomic_one_holds(
    own_redis, settings, alice, key
):
    # The same race across the two modes: the key is A's (atomic, no record yet)
    # when B (phased) would commit its `processing` record.
    settings.IDEMPOTENCY_LEASE_SECONDS = 1
    slow = {"amount": 5, "sleep": 2.5}
    first = Background(lambda: alice.post("/test/deposits", slow, key))
    first.start()
    time.sleep(1.5)  # A sleeps in its transaction; its Redis lock has expired
    second = alice.post("/test/phased-deposits", {"amount": 7}, key)
    assert_problem(second, 409, "idempotency_key_in_flight")
    a = first.outcome()
    assert a.status_code == 201, a.content
    assert alice.deposits() == 1
    assert_problem(
        alice.post("/test/phased-deposits", {"amount": 7}, key),
        422,
        "idempotency_key_reused",
    )


def test_a_refusal_keeps_its_key_until_it_is_stored(settings, monkeypatch, alice, key):
    # A's view refused; its transaction rolled back and the refusal is stored in a
    # transaction of its own. In between, the key must still be A's.
    settings.REDIS_URL = ""  # no Redis lock at all: the database alone decides
    rolled_back, go_on = threading.Event(), threading.Event()
    store_refusal = engine._store_refusal

    def slow_store_refusal(call, response):
        rolled_back.set()
        go_on.wait(timeout=30)
        return store_refusal(call, response)

    monkeypatch.setattr(engine, "_store_refusal", slow_store_refusal)
    refused = {"amount": 5, "fail": "refuse"}
    first = Background(lambda: alice.post("/test/deposits", refused, key))
    first.start()
    assert rolled_back.wait(timeout=30)
    try:
        second = alice.post("/test/deposits", {"amount": 7}, key)
    finally:
        go_on.set()
    assert_problem(second, 409, "idempotency_key_in_flight")
    assert_problem(first.outcome(), 422, "insufficient_funds")
    assert alice.deposits() == 0
    assert_problem(
        alice.post("/test/deposits", {"amount": 7}, key), 422, "idempotency_key_reused"
    )
