"""Attacks on the re-drive's new outcomes (`payment_apply_charge`): a charge of
another amount, a charge refunded at the provider, and what shows them (check_ledger,
the callback endpoint, the shop's order page)."""

import pytest
from django.db import transaction

from ledger.invariants import ledger_report
from orders.models import Order
from payments.exceptions import ProviderChargeUsed
from payments.models import Payment, ProviderEvent, Refund
from payments.services import (
    _payment_refund,
    payment_apply_charge,
    payment_pay_with_balance,
    payment_provider_start,
    provider_event_process,
)
from tests.helpers import (
    assert_problem,
    customer,
    event_body,
    new_key,
    pending_provider_payment,
    place_order,
    post_callback,
)
from tests.payments.test_redrive_outcomes import (
    ASKED,
    COLLECTED,
    answer,
    assert_given_back_not_kept,
)
from tests.payments.test_shop_pages import settled_note

pytestmark = pytest.mark.django_db


def test_a_customers_refund_reason_is_not_a_charge_of_another_amount():
    """The refund API takes the customer's own `reason` (free text): a wallet
    refund the customer calls "amount_mismatch" would look like a charge the
    provider collected for another amount. The reason is the system's alone: the
    API refuses it (`400 refund_reason_reserved`), nothing is refunded, and
    check_ledger names nothing."""
    user, api, _ = customer("mallory", balance=5000)
    order = place_order(user, amount=ASKED)
    paid = payment_pay_with_balance(order_id=order.pk)
    response = api.post(
        f"/api/v1/payments/{paid.pk}/refund",
        {"reason": "amount_mismatch"},
        format="json",
        headers={"Idempotency-Key": new_key()},
    )
    assert_problem(response, 400, "refund_reason_reserved")
    assert not Refund.objects.exists()
    report = ledger_report()
    assert report["ok"], report["violations"]
    assert report["warnings"] == [], report["warnings"]


def test_a_customers_provider_refund_reason_is_not_a_charge_of_another_amount():
    """The same for a provider payment the customer refunds with that reason: it
    is refused, and what the provider collected is what was asked."""
    user, api, _ = customer("mallet")
    order = place_order(user, amount=ASKED)
    payment = pending_provider_payment(order)
    payment_apply_charge(payment_id=payment.pk, charge=answer(payment, "SUCCESS"))
    response = api.post(
        f"/api/v1/payments/{payment.pk}/refund",
        {"reason": "Amount_Mismatch "},
        format="json",
        headers={"Idempotency-Key": new_key()},
    )
    assert_problem(response, 400, "refund_reason_reserved")
    assert Payment.objects.get(pk=payment.pk).status == Payment.Status.SUCCEEDED
    assert not any("collected" in w for w in ledger_report()["warnings"])


@pytest.mark.parametrize("method", ["balance", "provider"])
def test_an_old_refund_with_the_reason_is_no_charge_of_another_amount(method):
    """Refunds made before the API refused the system's reasons kept the customer's
    text, "amount_mismatch" included: check_ledger still must not name them as
    charges of another amount (it reads the amounts, never the reason). Made here
    as they were then, through the refund under the API's reserved check."""
    user, _, _ = customer(f"legacy-{method}", balance=5000)
    order = place_order(user, amount=ASKED)
    if method == "balance":
        payment = payment_pay_with_balance(order_id=order.pk)
    else:
        payment = pending_provider_payment(order)
        payment_apply_charge(payment_id=payment.pk, charge=answer(payment, "SUCCESS"))
    _payment_refund(payment_id=payment.pk, reason="amount_mismatch")
    assert Refund.objects.get(payment=payment).reason == "amount_mismatch"
    report = ledger_report()
    assert report["ok"], report["violations"]
    assert not any("collected" in w for w in report["warnings"]), report["warnings"]


def test_the_late_callback_of_another_amount_after_a_second_pay_attempt():
    """README: once the re-drive has given a charge of another amount back, the
    provider's callback for it "is then acknowledged and changes nothing". A second
    provider payment on the (still payable) order, opened by an earlier release
    for the amount asked: the provider's callback still names the first charge, its
    transaction and the amount collected: it must be acknowledged (the provider
    otherwise redelivers it for ever), and change nothing."""
    user, _, _ = customer("olga")
    order = place_order(user, amount=ASKED)
    first = pending_provider_payment(order)
    payment_apply_charge(
        payment_id=first.pk, charge=answer(first, "SUCCESS", COLLECTED)
    )
    with pytest.raises(ProviderChargeUsed), transaction.atomic():
        payment_provider_start(order_id=order.pk)  # no second attempt now
    # One opened before that was refused (a release that still opened them).
    second = Payment.objects.create(
        order=order, method=Payment.Method.PROVIDER, amount=ASKED, currency="CNY"
    )
    first.refresh_from_db()
    late = event_body(first, amount=COLLECTED)
    response = post_callback(late)
    assert response.status_code == 200, response.content
    provider_event_process(event_id=ProviderEvent.objects.get().pk)
    assert_given_back_not_kept_with_a_second(first, second)


def assert_given_back_not_kept_with_a_second(first: Payment, second: Payment) -> None:
    second.refresh_from_db()
    assert second.status == Payment.Status.PENDING
    Payment.objects.filter(pk=second.pk).delete()  # only to reuse the assertion
    assert_given_back_not_kept(first)


def test_the_order_page_of_a_charge_of_another_amount(client):
    """The order still takes money (the Pay buttons are offered); the note must not
    say that the order no longer took the payment: it was given back because the
    provider collected another amount than asked."""
    user, _, _ = customer("pia")
    client.force_login(user)
    order = place_order(user, amount=ASKED)
    payment = pending_provider_payment(order)
    payment_apply_charge(
        payment_id=payment.pk, charge=answer(payment, "SUCCESS", COLLECTED)
    )
    assert Order.objects.get(pk=order.pk).status == Order.Status.PENDING_PAYMENT
    live = client.get(f"/orders/{order.merchant_order_no}/live")
    body = live.content.decode()
    assert 'id="pay"' in body or 'id="pay-provider"' in body
    _level, text = settled_note(live)
    assert "no longer took it" not in text, text
    assert Refund.objects.get(payment=payment).reason == "amount_mismatch"


def test_after_a_charge_of_another_amount_the_provider_is_not_offered_again(client):
    """The provider keys its one charge by merchant order number, and it collected
    that one (for another amount, given back): the order page offers the wallet
    only, and a provider pay request is refused before the provider is asked, with
    a code that says so, stored under its key; the wallet still pays the order."""
    user, api, _ = customer("quin", balance=5000)
    client.force_login(user)
    order = place_order(user, amount=ASKED)
    payment = pending_provider_payment(order)
    payment_apply_charge(
        payment_id=payment.pk, charge=answer(payment, "SUCCESS", COLLECTED)
    )
    body = client.get(f"/orders/{order.merchant_order_no}/live").content.decode()
    assert 'id="pay"' in body  # the wallet still pays it
    assert 'id="pay-provider"' not in body
    payments = Payment.objects.count()
    key = new_key()
    for _ in range(2):  # and its retry, replayed
        response = api.post(
            f"/api/v1/orders/{order.merchant_order_no}/pay",
            {"method": "provider"},
            format="json",
            headers={"Idempotency-Key": key},
        )
        assert response.status_code == 409, response.content
        assert response.json()["code"] == "provider_charge_used"
    assert Payment.objects.count() == payments  # nothing opened
    # The shop's form (a page opened before, or a crafted post) says so too.
    page = client.post(
        f"/orders/{order.merchant_order_no}/pay", {"method": "provider"}, follow=True
    )
    assert "takes no other" in page.content.decode()
    assert Payment.objects.count() == payments
    paid = api.post(
        f"/api/v1/orders/{order.merchant_order_no}/pay",
        {"method": "balance"},
        format="json",
        headers={"Idempotency-Key": new_key()},
    )
    assert paid.status_code == 201, paid.content
    assert Order.objects.get(pk=order.pk).status == Order.Status.PAID
    report = ledger_report()
    assert report["ok"], report["violations"]


def test_a_shipped_orders_charge_refunded_at_the_provider():
    """Paid, shipped, then refunded at the provider (a chargeback): the re-drive
    of its payment (a task delivered after the callback settled it) refunds it
    once; the customer's refund afterwards is `already_refunded`."""
    from orders.services import order_ship

    user, api, _ = customer("uma")
    order = place_order(user, amount=ASKED)
    payment = pending_provider_payment(order)
    payment_apply_charge(payment_id=payment.pk, charge=answer(payment, "SUCCESS"))
    order_ship(order_id=order.pk)
    for _ in range(2):
        payment_apply_charge(payment_id=payment.pk, charge=answer(payment, "REFUNDED"))
    payment.refresh_from_db()
    assert payment.status == Payment.Status.REFUNDED
    assert Order.objects.get(pk=order.pk).status == Order.Status.REFUNDED
    assert Refund.objects.get(payment=payment).reason == "refunded_at_provider"
    response = api.post(
        f"/api/v1/payments/{payment.pk}/refund",
        {},
        format="json",
        headers={"Idempotency-Key": new_key()},
    )
    assert response.status_code == 409, response.content
    assert Refund.objects.count() == 1
    report = ledger_report()
    assert report["ok"], report["violations"]
