"""Refunds: `POST /api/v1/payments/<id>/refund`, once per payment."""

import pytest
from django.db import transaction

from ledger.invariants import ledger_report
from ledger.models import JournalEntry
from ledger.services import external_account, merchant_account
from orders.models import Order
from payments.exceptions import AlreadyRefunded, PaymentNotRefundable
from payments.models import Payment, ProviderEvent, Refund
from payments.services import (
    payment_pay_with_balance,
    payment_refund,
    provider_event_process,
)
from tests.conftest import run_in_threads
from tests.helpers import (
    assert_problem,
    balance,
    customer,
    event_body,
    new_key,
    pending_provider_payment,
    place_order,
    post_callback,
)

pytestmark = pytest.mark.django_db


def refund(client, payment_id, body=None, key=None):
    return client.post(
        f"/api/v1/payments/{payment_id}/refund",
        body if body is not None else {},
        format="json",
        headers={"Idempotency-Key": key or new_key()},
    )


def paid_order(username="alice", amount=1500):
    user, client, wallet = customer(username, balance=5000)
    order = place_order(user, amount=amount)
    payment = payment_pay_with_balance(order_id=order.pk)
    return client, wallet, order, payment


def test_refund_credits_the_wallet_back_and_moves_payment_and_order():
    client, wallet, order, payment = paid_order()
    assert balance(wallet) == 3500
    response = refund(client, payment.pk, {"reason": "damaged"})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["payment"] == payment.pk and body["order"] == order.merchant_order_no
    assert (body["amount"], body["currency"], body["reason"]) == (
        1500,
        "CNY",
        "damaged",
    )
    assert (body["payment_status"], body["order_status"]) == ("refunded", "refunded")
    assert balance(wallet) == 5000
    assert balance(merchant_account(currency="CNY")) == 0
    payment.refresh_from_db()
    order.refresh_from_db()
    assert payment.status == Payment.Status.REFUNDED
    assert order.status == Order.Status.REFUNDED
    entry = Refund.objects.get().journal_entry
    assert (entry.kind, entry.reference) == (
        JournalEntry.Kind.REFUND,
        f"refund:{payment.pk}",
    )
    assert ledger_report()["ok"]


def test_retry_with_the_same_key_replays_and_credits_once():
    client, wallet, _, payment = paid_order()
    key = new_key()
    first = refund(client, payment.pk, key=key)
    again = refund(client, payment.pk, key=key)
    assert first.status_code == again.status_code == 201
    assert again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    assert balance(wallet) == 5000 and Refund.objects.count() == 1


def test_second_refund_under_a_new_key_is_already_refunded():
    client, wallet, _, payment = paid_order()
    assert refund(client, payment.pk).status_code == 201
    body = assert_problem(refund(client, payment.pk), 409, "already_refunded")
    assert "already refunded" in body["detail"]
    assert balance(wallet) == 5000 and Refund.objects.count() == 1
    with pytest.raises(AlreadyRefunded), transaction.atomic():
        payment_refund(payment_id=payment.pk)
    assert ledger_report()["ok"]


def test_a_pending_payment_is_not_refundable():
    user, client, wallet = customer("alice", balance=5000)
    order = place_order(user)
    payment = Payment.objects.create(
        order=order, method="provider", amount=order.amount, currency="CNY"
    )
    assert_problem(refund(client, payment.pk), 409, "payment_not_refundable")
    with pytest.raises(PaymentNotRefundable), transaction.atomic():
        payment_refund(payment_id=payment.pk)
    assert not Refund.objects.exists() and balance(wallet) == 5000


def test_only_the_owner_may_refund():
    _, wallet, _, payment = paid_order()
    _, bob_client, _ = customer("bob")
    assert_problem(refund(bob_client, payment.pk), 404, "not_found")
    assert balance(wallet) == 3500 and not Refund.objects.exists()


@pytest.mark.parametrize("payment_id", ["0", "99999999", str(2**64), "-1", "abc"])
def test_unknown_payment_ids_are_not_found(payment_id):
    _, client, _ = customer("alice")
    response = refund(client, payment_id)
    assert response.status_code == 404, response.content
    assert response["Content-Type"] == "application/problem+json"


@pytest.mark.parametrize(
    "body",
    [
        {"reason": 1},
        {"reason": ""},
        {"reason": "x" * 65},
        {"amount": 1},
        [],
        "refund",
    ],
)
def test_bad_input_is_a_validation_problem(body):
    client, wallet, _, payment = paid_order()
    assert_problem(refund(client, payment.pk, body), 400, "validation_error")
    assert balance(wallet) == 3500 and not Refund.objects.exists()


def test_refund_needs_a_key():
    client, wallet, _, payment = paid_order()
    response = client.post(f"/api/v1/payments/{payment.pk}/refund", {}, format="json")
    assert_problem(response, 400, "idempotency_key_missing")
    assert balance(wallet) == 3500


@pytest.mark.django_db(transaction=True)
def test_racing_refunds_under_different_keys_credit_once(on_postgres):
    client, wallet, order, payment = paid_order("ivy")
    statuses = run_in_threads(6, lambda i: refund(client, payment.pk).status_code)
    assert sorted(statuses) == [201] + [409] * 5, statuses
    assert balance(wallet) == 5000
    assert Refund.objects.filter(payment=payment).count() == 1
    order.refresh_from_db()
    assert order.status == Order.Status.REFUNDED
    assert ledger_report()["ok"]


def test_a_provider_payment_is_refunded_back_out_through_the_provider():
    user, client, wallet = customer("june")
    payment = pending_provider_payment(place_order(user, amount=800))
    assert post_callback(event_body(payment)).status_code == 200
    provider_event_process(event_id=ProviderEvent.objects.get().pk)
    assert balance(merchant_account(currency="CNY")) == 800
    response = refund(client, payment.pk)
    assert response.status_code == 201, response.content
    assert response.json()["order_status"] == "refunded"
    assert balance(merchant_account(currency="CNY")) == 0
    assert balance(external_account(currency="CNY")) == 0
    assert balance(wallet) == 0  # the money goes back where it came from
    assert ledger_report()["ok"]
