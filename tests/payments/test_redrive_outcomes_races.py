"""Races on PostgreSQL, over real HTTP to the simulator, around the re-drive's new
outcomes: a charge of another amount racing a wallet payment, a cancel, a hold's
capture and a second provider pay attempt; a charge refunded at the provider
racing the customer's own refund."""

import pytest

from ledger.invariants import ledger_report
from ledger.models import JournalEntry
from ledger.services import external_account, merchant_account
from orders.models import Order
from payments.models import Payment, Refund
from payments.provider.models import Charge
from payments.provider_client import provider_charge_refund
from payments.services import (
    payment_cancel_open_charges,
    payment_redrive,
    payment_settle,
    payments_stuck,
    provider_reference,
    refund_reference,
)
from payments.tasks import payment_redrive_task, refund_return_at_provider_task
from tests.conftest import run_in_threads
from tests.helpers import balance, customer, new_key, place_order
from tests.payments.test_beat import age, settle_at_provider
from tests.payments.test_cancel import pay, provider_pending
from tests.payments.test_redrive_outcomes import ASKED, COLLECTED

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def stuck_with_another_amount(api, order: Order) -> Payment:
    """The order's provider payment, pending past the re-drive's timeout, its
    charge collected by the provider for another amount than asked."""
    started = provider_pending(api, order)
    age(Payment, started["id"], 3600)
    payment = Payment.objects.select_related("order").get(pk=started["id"])
    Charge.objects.filter(txn_id=payment.provider_txn_id).update(amount=COLLECTED)
    settle_at_provider(payment.pay_url, "confirm")
    return payment


def post(api, path: str, body: dict | None = None):
    return api.post(
        path, body or {}, format="json", headers={"Idempotency-Key": new_key()}
    )


def assert_money_once(order: Order, wallet, start: int) -> None:
    """The collected amount came in and went out once; the order kept the amount
    asked at most once, from the wallet; check_ledger holds."""
    mismatch = Refund.objects.filter(reason="amount_mismatch")
    assert mismatch.count() == 1
    (first,) = [r.payment for r in mismatch]
    assert first.amount == COLLECTED
    assert (
        JournalEntry.objects.filter(
            reference__in=[provider_reference(first), refund_reference(first)]
        ).count()
        == 2
    )
    assert JournalEntry.objects.filter(reference__startswith="provider:").count() == 1
    order.refresh_from_db()
    kept = ASKED if order.status == Order.Status.PAID else 0
    assert balance(wallet) == start - kept
    assert balance(merchant_account(currency="CNY")) == kept
    report = ledger_report()
    assert report["ok"], report["violations"]


def test_a_charge_of_another_amount_redriven_while_the_wallet_pays_and_cancels(
    provider,
):
    user, api, wallet = customer("quinn", balance=5000)
    order = place_order(user, amount=ASKED)
    payment = stuck_with_another_amount(api, order)
    assert payments_stuck(older_than_seconds=60) == [payment.pk]
    no = order.merchant_order_no

    def race(i: int):
        if i < 3:
            return payment_redrive_task(payment.pk)
        if i == 3:
            return pay(api, order, "balance").status_code
        return post(api, f"/api/v1/orders/{no}/cancel").status_code

    outcomes = run_in_threads(5, race)
    assert not [o for o in outcomes if isinstance(o, Exception)], outcomes
    assert sorted(outcomes[3:]) in ([201, 409], [200, 409]), outcomes
    # What the commits sent (no worker runs here): the cancel task, the return.
    payment_cancel_open_charges(order_id=order.pk)
    for refund in Refund.objects.all():
        refund_return_at_provider_task(refund.pk)
    assert_money_once(order, wallet, 5000)
    assert ledger_report()["warnings"] == []


def test_a_charge_of_another_amount_redriven_while_a_hold_is_captured(provider):
    """The order is authorized from the wallet (a hold) while the provider payment
    is stuck: the re-drive finds an order that no longer takes money and cancels
    the charge, which the payer has paid for another amount; the capture races
    it."""
    user, api, wallet = customer("ros", balance=5000)
    order = place_order(user, amount=ASKED)
    payment = stuck_with_another_amount(api, order)
    held = api.post(
        f"/api/v1/orders/{order.merchant_order_no}/pay",
        {"method": "balance", "capture": "manual"},
        format="json",
        headers={"Idempotency-Key": new_key()},
    )
    assert held.status_code == 201, held.content
    hold_payment = held.json()["id"]

    def race(i: int):
        if i < 3:
            return payment_redrive_task(payment.pk)
        return post(api, f"/api/v1/payments/{hold_payment}/capture").status_code

    outcomes = run_in_threads(4, race)
    assert not [o for o in outcomes if isinstance(o, Exception)], outcomes
    assert outcomes[3] == 200, outcomes
    for refund in Refund.objects.all():
        refund_return_at_provider_task(refund.pk)
    assert_money_once(order, wallet, 5000)
    assert Order.objects.get(pk=order.pk).status == Order.Status.PAID


def test_a_second_provider_attempt_after_a_charge_of_another_amount(provider):
    """The order is left payable after its charge of another amount was given back:
    a second provider pay attempt is refused before the provider is asked (it has
    the order number's one charge, paid and given back), then the wallet pays: the
    money of the charge is never booked twice, the order is paid once, and nothing
    is left pending."""
    user, api, wallet = customer("sol", balance=5000)
    order = place_order(user, amount=ASKED)
    payment = stuck_with_another_amount(api, order)
    assert payment_redrive(payment_id=payment.pk).status == Payment.Status.REFUNDED
    again = pay(api, order, "provider")
    assert again.status_code == 409, again.content
    assert again.json()["code"] == "provider_charge_used"
    assert not Payment.objects.filter(order=order).exclude(pk=payment.pk).exists()
    assert not Payment.objects.filter(order=order, status="pending").exists()
    assert pay(api, order, "balance").status_code == 201
    for refund in Refund.objects.all():
        refund_return_at_provider_task(refund.pk)
    assert_money_once(order, wallet, 5000)


def test_a_charge_refunded_at_the_provider_racing_the_customers_refund(provider):
    """Settled by its callback (paid), then refunded at the provider (a chargeback,
    say) while the customer asks for a refund too: one refund, once."""
    user, api, _ = customer("tam")
    order = place_order(user, amount=ASKED)
    started = provider_pending(api, order)
    payment = Payment.objects.select_related("order").get(pk=started["id"])
    settle_at_provider(payment.pay_url, "confirm")
    payment_settle(payment_id=payment.pk, provider_txn_id=payment.provider_txn_id)
    provider_charge_refund(merchant_order_no=order.merchant_order_no)

    def race(i: int):
        if i < 3:
            return payment_redrive_task(payment.pk)
        return post(api, f"/api/v1/payments/{payment.pk}/refund").status_code

    outcomes = run_in_threads(4, race)
    assert outcomes[3] in (201, 409), outcomes
    assert not [o for o in outcomes[:3] if isinstance(o, Exception)], outcomes
    assert Refund.objects.count() == 1
    for refund in Refund.objects.all():
        refund_return_at_provider_task(refund.pk)
    payment.refresh_from_db()
    assert payment.status == Payment.Status.REFUNDED
    assert Order.objects.get(pk=order.pk).status == Order.Status.REFUNDED
    assert balance(merchant_account(currency="CNY")) == 0
    assert balance(external_account(currency="CNY")) == 0
    report = ledger_report()
    assert report["ok"] and not report["warnings"], report
