"""A key whose Redis lock is lost while its first request still runs, on the endpoint
users pay through.

Request A pays order X with key K and is slow: another transaction holds X's row. Its
Redis lock goes away meanwhile (the lease runs out, or the cache Redis restarts). B
then pays order Y with the same K. The database must still see that A runs: B never
executes, A pays X, and every retry of B is refused as a reuse of A's key.
"""

import time

import pytest
from rest_framework.test import APIClient

from ledger.services import merchant_account
from orders.models import Order
from payments.models import Payment
from tests.conftest import Background
from tests.helpers import (
    assert_problem,
    blocked_on_lock,
    customer,
    new_key,
    place_order,
    row_locked,
    wait_for,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("on_postgres"),
]


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
    with row_locked(Order, x.pk):
        first = Background(lambda: pay(token_client(client), x, key))
        first.start()
        wait_for(blocked_on_lock, what="A's wait for X's row")  # A runs
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
