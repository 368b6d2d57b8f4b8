"""One rule for "the order's provider charge was used" (a provider payment that
booked money, `Payment.used_provider_charge`): the pay service that refuses a second
provider charge and the order page that stops offering one read it alike."""

import pytest

from orders.models import Order
from payments.models import Payment
from payments.services import payment_apply_charge, provider_charge_used
from tests.helpers import customer, pending_provider_payment, place_order
from tests.payments.test_redrive_outcomes import ASKED, COLLECTED, answer

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("method", Payment.Method.values)
@pytest.mark.parametrize("status", Payment.Status.values)
@pytest.mark.parametrize("booked", [False, True])
def test_a_payment_used_the_charge_if_a_provider_one_booked_money(
    method, status, booked
):
    payment = Payment(
        method=method, status=status, journal_entry_id=7 if booked else None
    )
    expected = method == Payment.Method.PROVIDER and booked
    assert payment.used_provider_charge is expected


def declined(order: Order) -> None:
    payment = pending_provider_payment(order)
    payment_apply_charge(payment_id=payment.pk, charge=answer(payment, "FAILED"))


def another_amount(order: Order) -> None:
    """Collected for another amount than the order's, and given back at once."""
    payment = pending_provider_payment(order)
    payment_apply_charge(
        payment_id=payment.pk, charge=answer(payment, "SUCCESS", COLLECTED)
    )


@pytest.mark.parametrize(
    ("history", "used"),
    [([], False), ([declined], False), ([another_amount], True)],
)
def test_the_pay_service_and_the_order_page_read_the_charge_alike(
    client, history, used
):
    user, _, _ = customer("uma", balance=5000)
    client.force_login(user)
    order = place_order(user, amount=ASKED)
    for step in history:
        step(order)
    assert Order.objects.get(pk=order.pk).status == Order.Status.PENDING_PAYMENT
    assert provider_charge_used(order_id=order.pk) is used
    page = client.get(f"/orders/{order.merchant_order_no}")
    assert page.context["payable"] is True
    assert page.context["provider_used"] is used
    assert ('id="pay-provider"' in page.content.decode()) is not used
