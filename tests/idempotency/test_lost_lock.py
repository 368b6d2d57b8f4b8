"""A key whose Redis lock is lost, or held by another mode, while its first request
still runs: the database decides (the engine's test deposits; the same on the pay
endpoint: tests/payments/test_lost_lock.py)."""

import threading
import time

import pytest

from idempotency import engine
from tests.conftest import Background
from tests.helpers import assert_problem

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("tests.idempotency.urls"),
    pytest.mark.usefixtures("on_postgres"),
]


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
