"""Refund reasons only the system gives (`amount_mismatch`, `refunded_at_provider`,
written when the provider's answer forces a refund) are refused wherever someone
asks for a refund: the API (`400 refund_reason_reserved`), the back office's form.
The shop's refund button takes no reason at all. The system's own refunds keep them.
"""

import pytest

from idempotency.models import IdempotencyRecord
from ledger.models import JournalEntry
from orders.models import Order
from payments.exceptions import RefundReasonReserved
from payments.models import Payment, Refund
from payments.services import (
    payment_apply_charge,
    payment_pay_with_balance,
    payment_refund,
)
from tests.backoffice import apply_action, messages_of, open_action, token_of
from tests.helpers import (
    assert_problem,
    balance,
    customer,
    new_key,
    pending_provider_payment,
    place_order,
)
from tests.payments.test_redrive_outcomes import ASKED, answer
from tests.payments.test_shop_pages import refund_form

pytestmark = pytest.mark.django_db

PAYMENTS = "/admin/payments/payment/"

RESERVED = [
    "amount_mismatch",
    "refunded_at_provider",
    "AMOUNT_MISMATCH",
    "Refunded_At_Provider",
    "  amount_mismatch  ",
    "\trefunded_at_provider\n",
    "order_already_paid",
    "Order_Authorized",
    " order_cancelled",
    # Full-width letters after an ideographic space.
    "\u3000" + "".join(chr(ord(c) + 0xFEE0) for c in "AMOUNT_MISMATCH"),
    # Invisible format characters (a zero-width space, a soft hyphen, a byte-order
    # mark): shown as the system's own reason, they would pass for it.
    "amount\u200b_mismatch",
    "refunded_at\u00ad_provider",
    "\ufeffamount_mismatch",
]


@pytest.fixture
def paid():
    """A payment of 1500 from bob's wallet (5000 before)."""
    user, api, wallet = customer("bob", balance=5000)
    order = place_order(user, amount=1500)
    return api, wallet, payment_pay_with_balance(order_id=order.pk)


def assert_nothing_written(payment: Payment, wallet) -> None:
    payment.refresh_from_db()
    assert payment.status == Payment.Status.SUCCEEDED
    assert Order.objects.get(pk=payment.order_id).status == Order.Status.PAID
    assert not Refund.objects.exists()
    assert not JournalEntry.objects.filter(kind=JournalEntry.Kind.REFUND).exists()
    assert balance(wallet) == 3500


def refund(api, payment, reason, key=None):
    return api.post(
        f"/api/v1/payments/{payment.pk}/refund",
        {"reason": reason},
        format="json",
        headers={"Idempotency-Key": key or new_key()},
    )


@pytest.mark.parametrize("reason", RESERVED)
def test_the_api_refuses_a_reserved_reason(paid, reason):
    api, wallet, payment = paid
    key = new_key()
    body = assert_problem(
        refund(api, payment, reason, key), 400, "refund_reason_reserved"
    )
    assert "reserved" in body["detail"] and list(body["errors"]) == ["reason"]
    assert_nothing_written(payment, wallet)
    # The same request again (a retry under its key): refused the same, still
    # nothing written; under a new key too.
    again = refund(api, payment, reason, key)
    assert again.json() == body
    assert_problem(refund(api, payment, reason), 400, "refund_reason_reserved")
    assert_nothing_written(payment, wallet)
    # Refused for its form, as a body failing the schema is: nothing is stored
    # under the key, and the corrected request runs under it.
    assert not IdempotencyRecord.objects.filter(key=key).exists()
    corrected = refund(api, payment, "damaged", key)
    assert corrected.status_code == 201, corrected.content
    assert Refund.objects.get().reason == "damaged"
    assert balance(wallet) == 5000


def test_a_reason_that_only_contains_the_words_is_the_customers_own(paid):
    api, wallet, payment = paid
    response = refund(api, payment, "  not an amount_mismatch  ")
    assert response.status_code == 201, response.content
    assert Refund.objects.get().reason == "not an amount_mismatch"
    assert balance(wallet) == 5000


def test_the_service_refuses_it_before_anything_is_read(paid):
    _, wallet, payment = paid
    with pytest.raises(RefundReasonReserved):
        payment_refund(payment_id=payment.pk, reason=" Refunded_at_Provider ")
    assert_nothing_written(payment, wallet)


def test_the_systems_own_refund_keeps_its_reason():
    """A charge the provider collected and refunded there: the re-drive's refund
    still carries `refunded_at_provider`."""
    user, _, _ = customer("carol")
    payment = pending_provider_payment(place_order(user, amount=ASKED))
    payment_apply_charge(payment_id=payment.pk, charge=answer(payment, "REFUNDED"))
    payment.refresh_from_db()
    assert payment.status == Payment.Status.REFUNDED
    assert Refund.objects.get(payment=payment).reason == "refunded_at_provider"


@pytest.mark.parametrize("reason", ["amount_mismatch", " REFUNDED_AT_PROVIDER "])
def test_the_back_office_refuses_a_reserved_reason(admin_client, paid, reason):
    _, wallet, payment = paid
    token = token_of(open_action(admin_client, PAYMENTS, "refund", [payment.pk]))
    for _ in range(2):  # the same form submitted again: refused again
        response = apply_action(
            admin_client, PAYMENTS, "refund", [payment.pk], token=token, reason=reason
        )
        assert response.status_code == 400
        page = response.content.decode()
        assert 'class="errorlist' in page and "is reserved for refunds" in page
        assert_nothing_written(payment, wallet)
    # Nothing was kept under the token: the form corrected acts once.
    done = apply_action(
        admin_client, PAYMENTS, "refund", [payment.pk], token=token, reason="damaged"
    )
    assert any("Refunded" in m for m in messages_of(done)), messages_of(done)
    assert Refund.objects.get().reason == "damaged"


def test_the_shop_takes_no_reason_from_its_form(client):
    """The shop's refund button sends no reason: one added to its form is not
    read, and the refund is `requested`."""
    user, _, wallet = customer("dave", balance=5000)
    client.force_login(user)
    order = place_order(user, amount=1500)
    payment_pay_with_balance(order_id=order.pk)
    url = f"/orders/{order.merchant_order_no}"
    page = client.get(url)
    assert 'name="reason"' not in page.content.decode()
    form = {**refund_form(page), "reason": "amount_mismatch"}
    assert client.post(f"{url}/refund", form).status_code == 303
    assert Refund.objects.get().reason == "requested"
    assert balance(wallet) == 5000
