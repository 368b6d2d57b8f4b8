"""Paying through the provider simulator, end to end, over real HTTP.

A gunicorn serves the app (our API, the callback endpoint and the simulator); a real
Celery worker on the Redis broker runs the simulator's deliveries and our processing.
"""

import contextlib
import json
import os
import re
import signal
import socket
import threading
import time

import httpx
import pytest
from django.utils import timezone

from idempotency.models import IdempotencyRecord
from ledger.invariants import ledger_report
from ledger.services import customer_get_or_create, external_account, merchant_account
from orders.models import Order
from payments.exceptions import ProviderRefused
from payments.models import Payment, ProviderEvent, Shipment
from payments.provider.models import Charge, Notification
from payments.provider.services import notification_body
from payments.provider_client import provider_charge_create, provider_charge_get
from tests.helpers import (
    assert_problem,
    balance,
    customer,
    new_key,
    place_order,
    wait_for,
)
from tests.servers import children, free_port, gunicorn
from tests.workers import BROKER_URL, SETTINGS, celery_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def worker(tmp_path, provider):
    with celery_worker(
        tmp_path,
        PROVIDER_CALLBACK_URL=f"{provider}/api/v1/payments/callback",
        PROVIDER_RETRY_SCALE="0.02",
        PROVIDER_DELIVER_TWICE="1",
    ) as process:
        yield process


def pay(client, order, key):
    return client.post(
        f"/api/v1/orders/{order.merchant_order_no}/pay",
        {"method": "provider"},
        format="json",
        headers={"Idempotency-Key": key},
    )


def confirm_on_the_pay_page(pay_url: str, action: str = "confirm") -> None:
    """What the payer's browser does: GET the page, POST the form (CSRF and all)."""
    with httpx.Client(timeout=10) as browser:
        page = browser.get(pay_url)
        assert page.status_code == 200 and 'data-status="PENDING"' in page.text
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token, page.text
        answer = browser.post(
            pay_url, data={"csrfmiddlewaretoken": token[1], "action": action}
        )
        assert answer.status_code == 303, answer.text


def test_pay_with_provider_confirm_and_settle_once(worker, provider):
    user, client, wallet = customer("alice", balance=100)
    order = place_order(user, amount=3000)
    key = new_key()
    response = pay(client, order, key)
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["method"], body["status"], body["amount"]) == (
        "provider",
        "pending",
        3000,
    )
    assert body["provider_txn_id"] and body["pay_url"].startswith(provider)
    again = pay(client, order, key)
    assert again.content == response.content and again["Idempotent-Replayed"]
    other = pay(client, order, new_key()).json()  # another key continues it
    assert (other["id"], other["provider_txn_id"]) == (
        body["id"],
        body["provider_txn_id"],
    )
    assert Charge.objects.count() == 1 and Payment.objects.count() == 1

    time.sleep(1)  # the provider never settles on its own
    assert provider_charge_get(merchant_order_no=order.merchant_order_no).status == (
        "PENDING"
    )
    assert Payment.objects.get().status == Payment.Status.PENDING

    confirm_on_the_pay_page(body["pay_url"])
    payment = Payment.objects.get()
    wait_for(
        lambda: Shipment.objects.filter(order=order, status="dispatched").exists(),
        what="settlement and shipment",
    )
    payment.refresh_from_db()
    order.refresh_from_db()
    assert payment.status == Payment.Status.SUCCEEDED
    assert order.status == Order.Status.PAID
    assert balance(wallet) == 100  # the money came from outside
    assert balance(merchant_account(currency="CNY")) == 3000
    assert balance(external_account(currency="CNY")) == -3100
    # Delivered twice on purpose: one event in our inbox, settled once.
    note = Notification.objects.get()
    assert note.delivered_at is not None and note.last_status == 200
    assert ProviderEvent.objects.count() == 1
    assert provider_charge_get(merchant_order_no=order.merchant_order_no).status == (
        "SUCCESS"
    )
    assert_problem(pay(client, order, new_key()), 409, "order_already_paid")
    report = ledger_report()
    assert report["ok"], report


def test_a_declined_payment_fails_and_the_shopper_can_pay_again(worker, provider):
    user, client, _ = customer("bob")
    order = place_order(user, amount=700)
    body = pay(client, order, new_key()).json()
    confirm_on_the_pay_page(body["pay_url"], action="decline")
    wait_for(
        lambda: Payment.objects.get().status == Payment.Status.FAILED,
        what="the failure",
    )
    order.refresh_from_db()
    assert order.status == Order.Status.PENDING_PAYMENT
    assert balance(merchant_account(currency="CNY")) == 0
    assert ledger_report()["ok"]
    # The shopper tries again: a new payment, the same (reopened) charge.
    retry = pay(client, order, new_key()).json()
    assert retry["id"] != body["id"] and retry["status"] == "pending"
    assert retry["provider_txn_id"] == body["provider_txn_id"]
    confirm_on_the_pay_page(retry["pay_url"])
    wait_for(
        lambda: Payment.objects.get(pk=retry["id"]).status == "succeeded",
        what="the second attempt to settle",
    )
    order.refresh_from_db()
    assert order.status == Order.Status.PAID
    assert Payment.objects.get(pk=body["id"]).status == "failed"
    assert balance(merchant_account(currency="CNY")) == 700
    assert ledger_report()["ok"]
    # Each event says what it said when it was made, however often it is sent
    # again: the decline still says FAILED though the charge was paid since.
    declined, paid = Notification.objects.order_by("pk")
    assert json.loads(notification_body(declined))["status"] == "FAILED"
    assert json.loads(notification_body(paid))["status"] == "SUCCESS"


def test_a_pay_request_cut_off_between_phases_resumes_without_a_second_charge(
    provider, settings
):
    user, client, _ = customer("carol")
    order = place_order(user, amount=1200)
    key = new_key()
    live = settings.PAYMENT_PROVIDER_URL
    settings.PAYMENT_PROVIDER_URL = f"http://127.0.0.1:{free_port()}/provider"
    assert_problem(pay(client, order, key), 503, "provider_unavailable")
    record = IdempotencyRecord.objects.get(key=key)
    assert record.recovery_point == "payment_created"
    assert Payment.objects.get().provider_txn_id == ""
    settings.PAYMENT_PROVIDER_URL = live
    response = pay(client, order, key)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["id"] == Payment.objects.get().pk and body["provider_txn_id"]
    assert Charge.objects.count() == 1 and Payment.objects.count() == 1
    record.refresh_from_db()
    assert record.recovery_point == "finished"


@pytest.mark.parametrize("mode", ["optional", "off"])
def test_a_provider_payment_without_the_idempotency_layer_is_a_provider_one(
    provider, settings, mode
):
    """A deployment may make the pay endpoint's key optional, or turn the layer off
    (`IDEMPOTENCY_ENDPOINTS`). A provider payment sent without a key then runs its
    phases on its own; it once went to the wallet instead, and debited it."""
    settings.IDEMPOTENCY_ENDPOINTS = {"orders.pay": mode}
    user, client, wallet = customer("alice", balance=5000)
    order = place_order(user, amount=1500)
    response = client.post(
        f"/api/v1/orders/{order.merchant_order_no}/pay",
        {"method": "provider"},
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["method"], body["status"]) == ("provider", "pending")
    assert body["pay_url"] and body["provider_txn_id"]
    assert balance(wallet) == 5000
    order.refresh_from_db()
    assert order.status == Order.Status.PENDING_PAYMENT
    assert Charge.objects.get().merchant_order_no == order.merchant_order_no


def test_the_provider_dedupes_by_merchant_order_number(provider):
    first = provider_charge_create(merchant_order_no="m-1", amount=500, currency="CNY")
    again = provider_charge_create(merchant_order_no="m-1", amount=500, currency="CNY")
    assert first == again and first.status == "PENDING"
    with pytest.raises(ProviderRefused):
        provider_charge_create(merchant_order_no="m-1", amount=501, currency="CNY")
    assert provider_charge_get(merchant_order_no="nope") is None
    assert Charge.objects.count() == 1
    stranger = httpx.post(
        f"{provider}/provider/charges",
        json={"merchant_order_no": "m-2", "amount": 1, "currency": "CNY"},
    )
    assert stranger.status_code == 403, stranger.text


def test_a_pay_request_killed_between_phases_is_resumed_by_its_retry(
    provider, tmp_path
):
    """The gunicorn worker serving the pay request is SIGKILLed while phase 2 waits
    on a provider that never answers; the retry, once the lease has passed, resumes
    from `payment_created` against the live provider: one payment, one charge."""
    user, client, _ = customer("erin")
    _, token, _ = customer_get_or_create(username="erin", currency="CNY")
    order = place_order(user, amount=1500)
    key = new_key()
    with socket.socket() as hole:  # accepts connections, never answers
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)
        with gunicorn(
            tmp_path,
            SETTINGS,
            CELERY_BROKER_URL=BROKER_URL,
            PAYMENT_PROVIDER_URL=f"http://127.0.0.1:{hole.getsockname()[1]}/provider",
            PAYMENT_PROVIDER_TIMEOUT_SECONDS="60",
            IDEMPOTENCY_LEASE_SECONDS="4",
        ) as (doomed, master):

            def send() -> None:
                with contextlib.suppress(httpx.HTTPError):
                    httpx.post(
                        f"{doomed}/api/v1/orders/{order.merchant_order_no}/pay",
                        json={"method": "provider"},
                        headers={
                            "Authorization": f"Token {token}",
                            "Idempotency-Key": key,
                        },
                        timeout=30,
                    )

            thread = threading.Thread(target=send)
            thread.start()
            wait_for(
                lambda: IdempotencyRecord.objects.filter(
                    key=key, recovery_point="payment_created"
                ).exists(),
                what="phase 1 to commit",
            )
            (victim,) = children(master.pid)
            os.kill(victim, signal.SIGKILL)
            thread.join(30)
    assert Payment.objects.get().provider_txn_id == ""
    assert not Charge.objects.exists()
    # Before the lease passes, the key is still held by the dead request.
    assert_problem(pay(client, order, key), 409, "idempotency_key_in_flight")
    held_until = IdempotencyRecord.objects.get(key=key).locked_until
    time.sleep(max(0.0, (held_until - timezone.now()).total_seconds()) + 0.3)
    response = pay(client, order, key)
    assert response.status_code == 201, response.content
    body = response.json()
    payment = Payment.objects.get()
    assert (body["id"], body["provider_txn_id"]) == (
        payment.pk,
        payment.provider_txn_id,
    )
    assert Charge.objects.get().txn_id == payment.provider_txn_id
    record = IdempotencyRecord.objects.get(key=key)
    assert record.recovery_point == "finished"
    again = pay(client, order, key)
    assert again.content == response.content
