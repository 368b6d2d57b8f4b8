"""How many SQL statements each write endpoint sends, pinned so none can silently grow.

The figures count every statement of one first execution, transaction control included
(the test's own transaction turns each BEGIN/COMMIT into SAVEPOINT/RELEASE, one round
trip each either way), in a running system: the shop's account exists and the Redis
fast path already knows the caller. A replay of a finished request sends none at all:
the replay middleware answers it from Redis.

When a number here changes, read the statements the failure prints: a new one must
earn its place; one that went away is a win to keep (lower the number).
"""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger.services import merchant_account
from orders.services import product_get_or_create, stock_top_up
from tests.helpers import (
    customer,
    event_body,
    new_key,
    pending_provider_payment,
    place_order,
    post_callback,
)

pytestmark = pytest.mark.django_db


def post(client, path: str, body: dict | None = None, key: str | None = None):
    headers = {"Idempotency-Key": key} if key else {}
    return client.post(path, body or {}, format="json", headers=headers)


def assert_statements(expected: int, status: int, send):
    with CaptureQueriesContext(connection) as captured:
        response = send()
    assert response.status_code == status, response.content
    sql = [query["sql"] for query in captured.captured_queries]
    listing = "\n".join(f"  {n}. {text[:150]}" for n, text in enumerate(sql, 1))
    assert len(sql) == expected, f"{len(sql)} statements, not {expected}:\n{listing}"
    return response


@pytest.fixture
def alice():
    user, client, _ = customer("alice", balance=100_000)
    merchant_account(currency="CNY")
    post(client, "/api/v1/preorders", key=new_key())  # the fast path learns the token
    return user, client


def test_preorder(alice):
    # token, BEGIN, key lookup, pre-order, key record, COMMIT
    _, client = alice
    assert_statements(6, 201, lambda: post(client, "/api/v1/preorders", key=new_key()))


def test_replay_sends_none(alice):
    _, client = alice
    key = new_key()
    post(client, "/api/v1/preorders", key=key)
    again = assert_statements(
        0, 201, lambda: post(client, "/api/v1/preorders", key=key)
    )
    assert again["Idempotent-Replayed"] == "true"


def test_order(alice):
    _, client = alice
    number = post(client, "/api/v1/preorders", key=new_key()).json()
    body = {
        "merchant_order_no": number["merchant_order_no"],
        "amount": 1500,
        "currency": "CNY",
        "description": "Tea",
    }
    # token, BEGIN, key lookup, the pre-order, the order (INSERT ... ON CONFLICT DO
    # NOTHING: no duplicate check before it, no savepoint around it), key record, COMMIT
    assert_statements(7, 201, lambda: post(client, "/api/v1/orders", body, new_key()))


def test_pay_with_balance(alice):
    user, client = alice
    path = f"/api/v1/orders/{place_order(user).merchant_order_no}/pay"
    pay = {"method": "balance"}
    # token, BEGIN, key lookup, the order (owner check), then in the engine's own
    # transaction (no savepoint: nothing rolls back to one): lock the order, wallet,
    # merchant, payment, the entry, two balances and the postings; payment and order
    # updates; its shipment (INSERT ... ON CONFLICT DO NOTHING); is a provider payment
    # of the order pending (its charge is then cancelled); key record, COMMIT
    assert_statements(18, 201, lambda: post(client, path, pay, new_key()))


def test_cancel(alice):
    user, client = alice
    path = f"/api/v1/orders/{place_order(user).merchant_order_no}/cancel"
    # token, BEGIN, key lookup, the order (owner check), lock it, the conditional
    # status update, its items (the stock to give back: none here, and the response
    # shows them), is a provider payment of the order pending (its charge is then
    # cancelled), key record, COMMIT
    assert_statements(10, 200, lambda: post(client, path, {}, new_key()))


def test_order_with_items(alice):
    _, client = alice
    for sku in ("TEA", "MUG"):
        product, _ = product_get_or_create(sku=sku, name=sku, price=500, currency="CNY")
        stock_top_up(product_id=product.pk, at_least=10)
    number = post(client, "/api/v1/preorders", key=new_key()).json()
    items = [{"sku": "TEA", "quantity": 2}, {"sku": "MUG", "quantity": 1}]
    body = {"merchant_order_no": number["merchant_order_no"], "items": items}
    # token, BEGIN, key lookup, the products (one read for all lines), the pre-order,
    # the order, its items (one INSERT), then per line in product id order: the
    # movement (INSERT ... ON CONFLICT DO NOTHING) and the conditional decrement;
    # key record, COMMIT
    assert_statements(13, 201, lambda: post(client, "/api/v1/orders", body, new_key()))


def test_cancel_with_items(alice):
    _, client = alice
    product, _ = product_get_or_create(sku="TEA", name="Tea", price=500, currency="CNY")
    stock_top_up(product_id=product.pk, at_least=10)
    number = post(client, "/api/v1/preorders", key=new_key()).json()
    body = {
        "merchant_order_no": number["merchant_order_no"],
        "items": [{"sku": "TEA", "quantity": 2}],
    }
    post(client, "/api/v1/orders", body, new_key())
    path = f"/api/v1/orders/{number['merchant_order_no']}/cancel"
    # as above, plus per line: the return movement and the increment
    assert_statements(12, 200, lambda: post(client, path, {}, new_key()))


def test_refund(alice):
    user, client = alice
    order = place_order(user)
    pay = {"method": "balance"}
    paid = post(client, f"/api/v1/orders/{order.merchant_order_no}/pay", pay, new_key())
    path = f"/api/v1/payments/{paid.json()['id']}/refund"
    # The payment's order is locked through the payment in one statement: one fewer
    # than reading the order's id first. Its shipment, not dispatched yet, is
    # cancelled: one conditional UPDATE.
    assert_statements(21, 201, lambda: post(client, path, {}, new_key()))


def test_provider_callback(alice):
    # the nonce claimed, the event looked up, the payment, the event stored
    user, _ = alice
    payment = pending_provider_payment(place_order(user))
    assert_statements(4, 200, lambda: post_callback(event_body(payment)))


def test_web_order_form(alice, client):
    user, _ = alice
    client.force_login(user)
    issued = client.get("/orders/new")["Location"]  # redirects to /orders/new?token=
    token = re.search(r"token=(\d+)", issued)
    assert token
    body = {"token": token.group(1), "amount": "7.50", "description": "Tea"}
    # session, user, the form's pre-order, the order (its form token is the key: a
    # second submit loses the ON CONFLICT and is shown the order the first one placed).
    # The view's own durable transaction shows here as a savepoint and its release,
    # inside the test's transaction (in production: BEGIN and COMMIT).
    assert_statements(6, 303, lambda: client.post("/orders/new", body))


def test_web_pay_button(alice, client):
    user, _ = alice
    client.force_login(user)
    url = f"/orders/{place_order(user).merchant_order_no}/pay"
    # session, user, the order, then `payment_pay_with_balance` as in the API, in the
    # view's own durable transaction (a savepoint and its release here, see above)
    assert_statements(17, 303, lambda: client.post(url))


@pytest.fixture
def recipients():
    from ledger.services import customer_get_or_create

    return [customer_get_or_create(username=f"r{n}", currency="CNY")[0]
            for n in range(100)]  # fmt: skip


def test_transfer(alice, recipients):
    _, client = alice
    body = {"to": "r0", "amount": 100, "currency": "CNY"}
    # token, BEGIN, key lookup, the recipients, every wallet locked in one statement
    # (in id order), the batch, the entry, the debit and the credit (each UPDATE ...
    # RETURNING the balance and version the postings record), postings, transfer,
    # key record, COMMIT
    assert_statements(
        13, 201, lambda: post(client, "/api/v1/transfers", body, new_key())
    )


def test_a_batch_of_100_transfers_costs_what_one_does(alice, recipients):
    _, client = alice
    items = [{"to": f"r{n}", "amount": 1, "currency": "CNY"} for n in range(100)]
    # the same statements as one transfer: each does the whole batch at once
    assert_statements(
        13,
        201,
        lambda: post(client, "/api/v1/transfers", {"transfers": items}, new_key()),
    )


def test_authorize(alice):
    user, client = alice
    path = f"/api/v1/orders/{place_order(user).merchant_order_no}/pay"
    authorize = {"method": "balance", "capture": "manual"}
    # token, BEGIN, key lookup, the order (owner check), then: lock the order,
    # wallet, the hold (INSERT ... ON CONFLICT DO NOTHING), `held` raised by one
    # conditional UPDATE, payment, order update, is a provider payment pending; key
    # record, COMMIT. No more than a balance payment (17): the balance does not move.
    assert_statements(13, 201, lambda: post(client, path, authorize, new_key()))


def test_capture(alice):
    user, client = alice
    order = place_order(user)
    authorize = {"method": "balance", "capture": "manual"}
    pay_path = f"/api/v1/orders/{order.merchant_order_no}/pay"
    paid = post(client, pay_path, authorize, new_key())
    path = f"/api/v1/payments/{paid.json()['id']}/capture"
    # token, BEGIN, key lookup, the payment (owner check), then: lock the order
    # (found through the payment), lock the payment with its hold, merchant, the hold
    # closed (UPDATE ... WHERE status = 'active' RETURNING), the entry, two balances
    # (the wallet's UPDATE also lowers `held`) and the postings; payment and order
    # updates; its shipment; key record, COMMIT. No more than a balance payment (18).
    assert_statements(17, 200, lambda: post(client, path, {}, new_key()))
