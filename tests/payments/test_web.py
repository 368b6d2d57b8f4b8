"""The web UI's Pay-with-provider button: to the provider's pay page, once,
however often and however fast it is pressed, and after a press cut off mid-way."""

import pytest
from django.test import Client

from payments import services
from payments.models import Payment, ProviderEvent
from payments.provider.models import Charge
from payments.provider.services import charge_settle
from payments.tasks import provider_event_process_task
from tests.conftest import run_in_threads
from tests.helpers import (
    assert_settled_once,
    balance,
    customer,
    event_body,
    place_order,
    post_callback,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_provider_button_leads_to_one_pay_page(client, provider, settings):
    user, _, _ = customer("alice")
    client.force_login(user)
    order = place_order(user, amount=2500)
    url = f"/orders/{order.merchant_order_no}"
    assert b'id="pay-provider"' in client.get(url).content
    first = client.post(f"{url}/pay", {"method": "provider"})
    assert first.status_code == 303
    assert first["Location"].startswith(f"{provider}/provider/pay/")
    again = client.post(f"{url}/pay", {"method": "provider"})  # a second click
    assert again["Location"] == first["Location"]
    assert Payment.objects.count() == 1 and Charge.objects.count() == 1
    page = client.get(url)
    assert first["Location"].encode() in page.content  # "Continue to the pay page"

    settings.PAYMENT_PROVIDER_URL = "http://127.0.0.1:9/provider"  # nobody there
    other = place_order(user, amount=100)
    down = client.post(f"/orders/{other.merchant_order_no}/pay", {"method": "provider"})
    assert down.status_code == 303
    assert down["Location"] == f"/orders/{other.merchant_order_no}"


def test_the_provider_button_pressed_at_once_opens_one_charge(provider):
    """Four tabs press "Pay with the provider" at the same instant: one payment, one
    charge at the provider, and every tab is sent to its one pay page."""
    user, _, _ = customer("bob")
    order = place_order(user, amount=2500)
    url = f"/orders/{order.merchant_order_no}/pay"

    def press(i: int) -> tuple[int, str]:
        browser = Client(raise_request_exception=False)
        browser.force_login(user)
        answer = browser.post(url, {"method": "provider"})
        return answer.status_code, answer.get("Location", "")

    results = run_in_threads(4, press)
    payment = Payment.objects.get(order=order)
    charge = Charge.objects.get()
    assert payment.provider_txn_id == charge.txn_id and payment.pay_url
    assert results == [(303, payment.pay_url)] * 4, results


def test_a_press_cut_off_after_the_provider_answered_is_continued(
    client, provider, monkeypatch
):
    """The web process dies after the provider opened the charge and before the
    charge was recorded (the pending payment committed, the pay page unknown):
    the next press continues that payment with the provider's one charge, never a
    second one, and the charge's pay page settles the order once."""
    user, _, wallet = customer("cal", balance=0)
    client.force_login(user)
    order = place_order(user, amount=2500)
    url = f"/orders/{order.merchant_order_no}"
    record = services.payment_record_charge

    def died(**kwargs):
        monkeypatch.setattr(services, "payment_record_charge", record)
        raise SystemExit("the worker process was killed")

    monkeypatch.setattr(services, "payment_record_charge", died)
    with pytest.raises(SystemExit):
        client.post(f"{url}/pay", {"method": "provider"})
    payment = Payment.objects.get(order=order)
    assert payment.status == Payment.Status.PENDING and not payment.pay_url
    charge = Charge.objects.get()  # opened at the provider, unknown to us

    again = client.post(f"{url}/pay", {"method": "provider"})
    assert again.status_code == 303
    payment.refresh_from_db()
    assert payment.provider_txn_id == charge.txn_id
    assert again["Location"] == payment.pay_url
    assert Payment.objects.filter(order=order).count() == 1
    assert Charge.objects.count() == 1

    # The payer confirms on the pay page; its callback settles the order once.
    charge_settle(txn_id=charge.txn_id, outcome=Charge.Status.SUCCESS)
    assert post_callback(event_body(payment)).status_code == 200
    provider_event_process_task(ProviderEvent.objects.get().pk)
    assert_settled_once(payment)
    assert balance(wallet) == 0
