"""The provider simulator's cancel endpoint and the pay page of a cancelled charge,
and the order page once the order is paid, all in process.

The whole flow over real HTTP, with the cancel task, races and a crash, is in
`test_cancel.py`.
"""

import re

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from payments.provider.models import Charge, Notification
from payments.provider.services import charge_create, charge_settle
from payments.services import payment_pay_with_balance
from tests.conftest import run_in_threads
from tests.helpers import (
    assert_problem,
    customer,
    pending_provider_payment,
    place_order,
)

pytestmark = pytest.mark.django_db


def merchant() -> APIClient:
    client = APIClient()
    client.credentials(HTTP_X_MERCHANT_SECRET=settings.PAYMENT_PROVIDER_SECRET)
    return client


def open_charge(number: str = "m-1") -> Charge:
    charge, created = charge_create(
        merchant_order_no=number, amount=500, currency="CNY"
    )
    assert created
    return charge


def cancel(number: str, client: APIClient | None = None, **extra):
    return (client or merchant()).post(
        f"/provider/charges/{number}/cancel", format="json", **extra
    )


def test_cancel_is_idempotent_and_final():
    charge = open_charge()
    first = cancel("m-1")
    assert first.status_code == 200, first.content
    assert first.json()["status"] == "CANCELLED"
    again = cancel("m-1")
    assert again.status_code == 200 and again.json() == first.json()
    charge.refresh_from_db()
    assert charge.status == Charge.Status.CANCELLED
    # The payer cannot settle it any more, and the merchant cannot reopen it.
    charge_settle(txn_id=charge.txn_id, outcome=Charge.Status.SUCCESS)
    assert Charge.objects.get().status == Charge.Status.CANCELLED
    assert not Notification.objects.exists()
    reopened, created = charge_create(
        merchant_order_no="m-1", amount=500, currency="CNY"
    )
    assert not created and reopened.status == Charge.Status.CANCELLED
    got = merchant().get("/provider/charges/m-1")
    assert got.json()["status"] == "CANCELLED"


def test_a_declined_charge_can_be_cancelled_a_paid_one_cannot():
    declined, paid = open_charge("m-1"), open_charge("m-2")
    charge_settle(txn_id=declined.txn_id, outcome=Charge.Status.FAILED)
    charge_settle(txn_id=paid.txn_id, outcome=Charge.Status.SUCCESS)
    assert cancel("m-1").json()["status"] == "CANCELLED"
    body = assert_problem(cancel("m-2"), 409, "provider_charge_conflict")
    assert "paid already" in body["detail"]
    assert Charge.objects.get(pk=paid.pk).status == Charge.Status.SUCCESS


@pytest.mark.parametrize(
    "number", ["unknown", "%00", "a%00b", "x" * 65, "%F0%9F%92%A5", "..%2F"]
)
def test_unknown_or_malformed_numbers_are_404(number):
    open_charge()
    response = cancel(number)
    assert response.status_code == 404, response.content
    assert merchant().get(f"/provider/charges/{number}").status_code == 404
    assert Charge.objects.get().status == Charge.Status.PENDING


def test_only_the_merchant_may_cancel_and_only_by_post():
    open_charge()
    assert cancel("m-1", APIClient()).status_code == 403
    stranger = APIClient()
    stranger.credentials(HTTP_X_MERCHANT_SECRET="not-the-secret")
    assert cancel("m-1", stranger).status_code == 403
    assert merchant().get("/provider/charges/m-1/cancel").status_code == 405
    assert merchant().delete("/provider/charges/m-1/cancel").status_code == 405
    # A body is not needed and not read: garbage changes nothing.
    garbage = merchant().generic(
        "POST", "/provider/charges/m-1/cancel", b"\xff{", "application/json"
    )
    assert garbage.status_code == 200 and garbage.json()["status"] == "CANCELLED"


def test_the_pay_page_refuses_to_confirm_a_cancelled_charge(client):
    charge = open_charge()
    url = f"/provider/pay/{charge.txn_id}"
    page = client.get(url).content.decode()  # opened while pending
    assert 'id="confirm"' in page
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token
    assert cancel("m-1").status_code == 200
    for action in ("confirm", "decline", "bogus"):
        refused = client.post(url, {"csrfmiddlewaretoken": token[1], "action": action})
        assert refused.status_code == 409
        text = refused.content.decode()
        assert "Your confirmation was refused" in text
        assert "the merchant cancelled this payment" in text
    shown = client.get(url).content.decode()
    assert 'data-status="CANCELLED"' in shown and 'id="confirm"' not in shown
    assert "You have not been charged" in shown
    assert Charge.objects.get().status == Charge.Status.CANCELLED
    assert not Notification.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_cancel_and_a_confirmation_racing_end_one_way(on_postgres):
    for n in range(5):
        charge = open_charge(f"race-{n}")

        def work(i: int, charge=charge):
            if i == 0:
                return charge_settle(txn_id=charge.txn_id, outcome="SUCCESS").status
            return cancel(charge.merchant_order_no).status_code

        settled, *cancels = run_in_threads(3, work)
        charge.refresh_from_db()
        if charge.status == Charge.Status.CANCELLED:
            assert settled == "CANCELLED" and cancels == [200, 200]
            assert not charge.notifications.exists()
        else:
            assert charge.status == settled == "SUCCESS"
            assert cancels == [409, 409]
            assert charge.notifications.count() == 1


def test_a_paid_order_no_longer_offers_its_pay_page(client):
    user, _, _ = customer("alice", balance=5000)
    order = place_order(user, amount=2500)
    payment = pending_provider_payment(order)
    client.force_login(user)
    url = f"/orders/{order.merchant_order_no}"
    page = client.get(url).content.decode()
    assert "Continue to the pay page" in page and payment.pay_url in page
    payment_pay_with_balance(order_id=order.pk)  # its cancel task has not run yet
    page = client.get(url).content.decode()
    assert "Continue to the pay page" not in page and payment.pay_url not in page
    assert 'id="pay-provider"' not in page
