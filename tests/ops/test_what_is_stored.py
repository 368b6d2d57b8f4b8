"""What is stored under a key: one rule on every idempotent endpoint.

An outcome decided once the endpoint began executing (2xx, a business 4xx) is stored
and replayed. A refusal of the request's form (malformed JSON, a body that fails the
endpoint's schema, a media type it does not take) stores nothing and leaves the key
free, so the corrected request may use it.
"""

import json
from dataclasses import dataclass

import pytest

from idempotency.models import IdempotencyRecord
from ledger.services import merchant_account
from orders.services import preorder_create
from payments.services import payment_pay_with_balance, payment_refund
from tests.helpers import assert_problem, customer, new_key, place_order

pytestmark = pytest.mark.django_db


@dataclass
class Endpoint:
    path: str
    good: dict  # the corrected request: it runs
    bad_schema: dict  # well-formed JSON the endpoint's schema refuses
    status: int  # of the good request


def orders(user) -> Endpoint:
    number = preorder_create(owner=user).merchant_order_no
    good = {"merchant_order_no": number, "amount": 1500, "currency": "CNY"}
    return Endpoint("/api/v1/orders", good, {**good, "amount": "lots"}, 201)


def pay(user) -> Endpoint:
    path = f"/api/v1/orders/{place_order(user).merchant_order_no}/pay"
    return Endpoint(path, {"method": "balance"}, {"method": "cash"}, 201)


def cancel(user) -> Endpoint:
    path = f"/api/v1/orders/{place_order(user).merchant_order_no}/cancel"
    return Endpoint(path, {}, {"reason": "changed my mind"}, 200)


def refund(user) -> Endpoint:
    payment = payment_pay_with_balance(order_id=place_order(user).pk)
    path = f"/api/v1/payments/{payment.pk}/refund"
    return Endpoint(path, {"reason": "damaged"}, {"reason": 5}, 201)


def transfers(user) -> Endpoint:
    customer("bob")
    good = {"to": "bob", "amount": 100, "currency": "CNY"}
    return Endpoint("/api/v1/transfers", good, {**good, "amount": "lots"}, 201)


ENDPOINTS = {
    "orders": orders,
    "pay": pay,
    "cancel": cancel,
    "refund": refund,
    "transfers": transfers,
}


@pytest.fixture
def alice():
    merchant_account(currency="CNY")
    user, client, _ = customer("alice", balance=100_000)
    return user, client


def send(client, path: str, raw: bytes, key: str, content_type="application/json"):
    return client.generic(
        "POST", path, raw, content_type=content_type, headers={"Idempotency-Key": key}
    )


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize(
    "refusal", ["malformed JSON", "schema", "media type", "charset", "Latin-1"]
)
def test_a_refusal_of_the_form_stores_nothing_and_frees_the_key(
    alice, endpoint, refusal
):
    user, client = alice
    target = ENDPOINTS[endpoint](user)
    key = new_key()
    raw, content_type, status = {
        "malformed JSON": (b'{"method": ', "application/json", 400),
        "schema": (json.dumps(target.bad_schema).encode(), "application/json", 400),
        "media type": (b"method=balance", "text/plain", 415),
        # JSON is UTF-8: the key's fingerprint reads the bytes so, and a body read
        # otherwise would be another request under it (the same bytes in Latin-1
        # mean other text) or the same one under another (key order would count).
        "charset": (
            json.dumps(target.good).encode("utf-16"),
            "application/json; charset=utf-16",
            415,
        ),
        "Latin-1": (
            json.dumps(target.good).encode(),
            "application/json; charset=iso-8859-1",
            415,
        ),
    }[refusal]
    for _ in range(2):  # refused afresh each time, never replayed
        refused = send(client, target.path, raw, key, content_type)
        assert refused.status_code == status, refused.content
        assert refused["Content-Type"] == "application/problem+json"
        assert "Idempotent-Replayed" not in refused
    assert not IdempotencyRecord.objects.filter(key=key).exists()
    corrected = send(client, target.path, json.dumps(target.good).encode(), key)
    assert corrected.status_code == target.status, corrected.content
    assert "Idempotent-Replayed" not in corrected
    again = send(client, target.path, json.dumps(target.good).encode(), key)
    assert again.content == corrected.content and again["Idempotent-Replayed"] == "true"


def business_refusal(user, endpoint: str) -> tuple[str, dict, int, str]:
    """(path, body, status, code) of a request its endpoint refuses on the merits."""
    if endpoint == "orders":
        body = {"merchant_order_no": "1234567", "amount": 1500}
        return "/api/v1/orders", body, 422, "merchant_order_no_unknown"
    if endpoint == "pay":
        order = place_order(user, amount=10**9)
        path = f"/api/v1/orders/{order.merchant_order_no}/pay"
        return path, {"method": "balance"}, 422, "insufficient_funds"
    if endpoint == "transfers":
        body = {"to": "nobody", "amount": 1, "currency": "CNY"}
        return "/api/v1/transfers", body, 422, "recipient_unknown"
    order = place_order(user)
    payment = payment_pay_with_balance(order_id=order.pk)
    if endpoint == "cancel":
        path = f"/api/v1/orders/{order.merchant_order_no}/cancel"
        return path, {}, 409, "order_not_cancellable"
    payment_refund(payment_id=payment.pk, reason="requested")
    return f"/api/v1/payments/{payment.pk}/refund", {}, 409, "already_refunded"


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_business_refusal_is_stored_and_replayed(alice, endpoint):
    user, client = alice
    path, body, status, code = business_refusal(user, endpoint)
    key = new_key()
    first = client.post(path, body, format="json", headers={"Idempotency-Key": key})
    assert_problem(first, status, code)
    record = IdempotencyRecord.objects.get(key=key)
    assert (record.status, record.response_status) == ("failed", status)
    again = client.post(path, body, format="json", headers={"Idempotency-Key": key})
    assert again.content == first.content and again["Idempotent-Replayed"] == "true"
