import pytest

from ledger.invariants import ledger_report
from orders.models import Order
from payments.models import Payment, Shipment
from tests.conftest import run_in_threads
from tests.helpers import (
    assert_problem,
    balance,
    customer,
    new_key,
    place_order,
)

pytestmark = pytest.mark.django_db


def pay(client, order, body=None, key=None):
    return client.post(
        f"/api/v1/orders/{order.merchant_order_no}/pay",
        body if body is not None else {"method": "balance"},
        format="json",
        headers={"Idempotency-Key": key or new_key()},
    )


def test_pay_with_balance():
    user, client, wallet = customer("alice", balance=5000)
    order = place_order(user, amount=1500)
    response = pay(client, order)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["order"] == order.merchant_order_no
    assert (body["amount"], body["currency"], body["method"], body["status"]) == (
        1500,
        "CNY",
        "balance",
        "succeeded",
    )
    assert body["id"] == Payment.objects.get().pk
    assert balance(wallet) == 3500
    detail = client.get(f"/api/v1/orders/{order.merchant_order_no}").json()
    assert detail["status"] == "paid" and detail["paid_at"]
    # Paid from the wallet, it ships as a provider-paid order does: one shipment.
    assert Shipment.objects.get().order_id == order.pk


def test_retry_with_the_same_key_replays_and_debits_once():
    user, client, wallet = customer("alice", balance=5000)
    order = place_order(user, amount=1500)
    key = new_key()
    first = pay(client, order, key=key)
    again = pay(client, order, key=key)
    assert first.status_code == again.status_code == 201
    assert again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    assert balance(wallet) == 3500
    assert Shipment.objects.filter(order=order).count() == 1


def test_paying_again_under_a_new_key_is_already_paid():
    user, client, wallet = customer("alice", balance=5000)
    order = place_order(user, amount=1500)
    assert pay(client, order).status_code == 201
    body = assert_problem(pay(client, order), 409, "order_already_paid")
    assert "already paid" in body["detail"]
    assert balance(wallet) == 3500
    assert ledger_report()["ok"]


def test_insufficient_funds():
    user, client, wallet = customer("alice", balance=100)
    order = place_order(user, amount=1500)
    assert_problem(pay(client, order), 422, "insufficient_funds")
    assert balance(wallet) == 100 and not Payment.objects.exists()


def test_cancelled_order_is_not_payable():
    user, client, _ = customer("alice", balance=5000)
    order = place_order(user)
    client.post(
        f"/api/v1/orders/{order.merchant_order_no}/cancel",
        headers={"Idempotency-Key": new_key()},
    )
    assert_problem(pay(client, order), 409, "order_not_payable")


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"method": "cash"},
        {"method": 1},
        {"method": None},
        {"method": ["balance"]},
        {"method": "balance", "amount": 1},
        {"method": "provider", "amount": 1},
        {"method": "provider", "extra": None},
        [],
        "balance",
    ],
)
def test_bad_input_is_a_validation_problem(body):
    user, client, wallet = customer("alice", balance=5000)
    order = place_order(user)
    assert_problem(pay(client, order, body), 400, "validation_error")
    assert balance(wallet) == 5000
    order.refresh_from_db()
    assert order.status == Order.Status.PENDING_PAYMENT


def test_pay_needs_a_key_and_the_owner():
    user, client, wallet = customer("alice", balance=5000)
    order = place_order(user)
    url = f"/api/v1/orders/{order.merchant_order_no}/pay"
    assert_problem(
        client.post(url, {"method": "balance"}, format="json"),
        400,
        "idempotency_key_missing",
    )
    _, bob_client, _ = customer("bob", balance=5000)
    assert_problem(pay(bob_client, order), 404, "not_found")
    assert balance(wallet) == 5000


@pytest.mark.django_db(transaction=True)
def test_racing_pays_under_different_keys_debit_once(on_postgres):
    user, client, wallet = customer("hank", balance=5000)
    order = place_order(user, amount=1500)
    statuses = run_in_threads(6, lambda i: pay(client, order).status_code)
    assert sorted(statuses) == [201] + [409] * 5, statuses
    assert balance(wallet) == 3500
    assert Shipment.objects.filter(order=order).count() == 1
    assert ledger_report()["ok"]


def test_an_order_and_a_payment_show_each_payment_to_their_owner_only():
    user, client, _ = customer("erin", balance=5000)
    order = place_order(user, amount=700)
    paid = pay(client, order).json()
    body = client.get(f"/api/v1/orders/{order.merchant_order_no}").json()
    assert [
        (p["id"], p["method"], p["amount"], p["status"]) for p in body["payments"]
    ] == [(paid["id"], "balance", 700, "succeeded")]
    shown = client.get(f"/api/v1/payments/{paid['id']}")
    assert shown.status_code == 200 and shown.json() == paid
    _, stranger, _ = customer("frank")
    assert_problem(stranger.get(f"/api/v1/payments/{paid['id']}"), 404, "not_found")
    for unknown in (paid["id"] + 1000, 0, 2**63):
        assert client.get(f"/api/v1/payments/{unknown}").status_code == 404
