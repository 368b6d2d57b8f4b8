"""An order paid one way has its other open provider charge cancelled: at the
provider (the pay page then refuses to confirm it) and here (the payment is
`cancelled`, no longer offered). A charge the payer confirmed first is refunded.

Over real HTTP: a gunicorn serves our API and the provider simulator; the cancel
task runs in process, or in a real Celery worker where the test says so.
"""

import os
import re
import signal
from datetime import timedelta

import httpx
import pytest
from django.db import connection
from django.utils import timezone

from ledger.invariants import ledger_report
from ledger.services import external_account, merchant_account
from orders.models import Order
from orders.services import order_cancel
from payments import services
from payments.exceptions import ProviderUnavailable
from payments.models import Payment, ProviderEvent, Refund
from payments.provider.models import Charge, Notification
from payments.provider.services import notification_deliver
from payments.services import payment_redrive, provider_event_process
from payments.tasks import cancel_expired_orders, payment_cancel_open_charges_task
from tests.conftest import run_in_threads
from tests.helpers import (
    balance,
    blocked_on_lock,
    customer,
    new_key,
    place_order,
    row_locked,
    wait_for,
)
from tests.servers import children, free_port
from tests.workers import pool_child

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CANCELLED_NOTE = "the merchant cancelled this payment"


def pay(client, order: Order, method: str, key: str = "") -> httpx.Response:
    return client.post(
        f"/api/v1/orders/{order.merchant_order_no}/pay",
        {"method": method},
        format="json",
        headers={"Idempotency-Key": key or new_key()},
    )


class PayPage:
    """The payer's browser tab on the pay page, opened while the charge was
    pending (so it shows Confirm, whatever happens to the charge later)."""

    def __init__(self, pay_url: str) -> None:
        self.url = pay_url
        self.browser = httpx.Client(timeout=10)
        page = self.browser.get(pay_url)
        assert 'data-status="PENDING"' in page.text, page.text
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token, page.text
        self.token = token[1]

    def confirm(self) -> httpx.Response:
        return self.browser.post(
            self.url, data={"csrfmiddlewaretoken": self.token, "action": "confirm"}
        )


def provider_pending(client, order: Order) -> dict:
    response = pay(client, order, "provider")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "pending" and body["pay_url"]
    return body


def assert_paid_once_from_the_balance(order: Order, wallet, start: int) -> None:
    order.refresh_from_db()
    assert order.status == Order.Status.PAID
    assert balance(wallet) == start - order.amount
    assert balance(merchant_account(currency="CNY")) == order.amount
    assert balance(external_account(currency="CNY")) == -start
    report = ledger_report()
    assert report["ok"], report


def test_paying_from_the_balance_cancels_the_open_provider_charge(
    worker, provider, client
):
    user, api, wallet = customer("alice", balance=5000)
    order = place_order(user, amount=3000)
    started = provider_pending(api, order)
    tab = PayPage(started["pay_url"])  # the shopper opened the pay page ...
    client.force_login(user)
    page = client.get(f"/orders/{order.merchant_order_no}").content.decode()
    assert "Continue to the pay page" in page

    paid = pay(api, order, "balance")  # ... and then paid from the balance
    assert paid.status_code == 201, paid.content
    assert paid.json()["status"] == "succeeded"
    # The worker cancels the charge at the provider, then our payment.
    wait_for(
        lambda: Payment.objects.get(pk=started["id"]).status == "cancelled",
        what="the provider payment to be cancelled",
    )
    charge = Charge.objects.get(merchant_order_no=order.merchant_order_no)
    assert charge.status == Charge.Status.CANCELLED

    # The stale tab's Confirm is refused, with a clear message; nothing settles.
    refused = tab.confirm()
    assert refused.status_code == 409, refused.text
    assert "Your confirmation was refused" in refused.text
    assert CANCELLED_NOTE in refused.text and "not been charged" in refused.text
    fresh = httpx.get(started["pay_url"])
    assert fresh.status_code == 200 and CANCELLED_NOTE in fresh.text
    assert 'id="confirm"' not in fresh.text
    charge.refresh_from_db()
    assert charge.status == Charge.Status.CANCELLED
    assert not Notification.objects.exists()

    # Our side no longer offers it, and says what became of it.
    page = client.get(f"/orders/{order.merchant_order_no}").content.decode()
    assert "Continue to the pay page" not in page
    assert started["pay_url"] not in page
    body = api.get(f"/api/v1/orders/{order.merchant_order_no}").json()
    assert {(p["method"], p["status"]) for p in body["payments"]} == {
        ("balance", "succeeded"),
        ("provider", "cancelled"),
    }
    assert api.get(f"/api/v1/payments/{started['id']}").json()["status"] == (
        "cancelled"
    )
    assert_paid_once_from_the_balance(order, wallet, 5000)


def test_cancelling_the_order_cancels_its_open_provider_charge(worker, provider):
    """The shopper cancels an order whose provider payment is open (its pay page
    still in a tab): the charge is cancelled at the provider, so that tab can no
    longer take money for an order that no longer wants it."""
    user, api, wallet = customer("fay", balance=5000)
    order = place_order(user, amount=2000)
    started = provider_pending(api, order)
    tab = PayPage(started["pay_url"])
    cancelled = api.post(
        f"/api/v1/orders/{order.merchant_order_no}/cancel",
        headers={"Idempotency-Key": new_key()},
    )
    assert cancelled.status_code == 200, cancelled.content
    wait_for(
        lambda: Payment.objects.get(pk=started["id"]).status == "cancelled",
        what="the provider payment to be cancelled",
    )
    assert Charge.objects.get().status == Charge.Status.CANCELLED
    refused = tab.confirm()
    assert refused.status_code == 409, refused.text
    assert not Notification.objects.exists() and not Refund.objects.exists()
    assert balance(wallet) == 5000
    report = ledger_report()
    assert report["ok"], report


def test_an_order_expiring_unpaid_cancels_its_open_provider_charge(worker, provider):
    """Beat's expiry of unpaid orders cancels them in batches, not through
    `order_cancel`; their open charges are cancelled all the same, so a pay page
    left in a tab cannot take money for an order that has expired (that money would
    only come back as a refund). Run twice, the expiry cancels nothing more."""
    user, api, wallet = customer("gus", balance=5000)
    expiring, fresh = place_order(user, amount=2100), place_order(user, amount=2200)
    started = {o.pk: provider_pending(api, o) for o in (expiring, fresh)}
    tab = PayPage(started[expiring.pk]["pay_url"])
    Order.objects.filter(pk=expiring.pk).update(
        created_at=timezone.now() - timedelta(days=2)
    )
    assert cancel_expired_orders() == 1
    assert cancel_expired_orders() == 0
    wait_for(
        lambda: (
            Payment.objects.get(pk=started[expiring.pk]["id"]).status == "cancelled"
        ),
        what="the expired order's provider payment to be cancelled",
    )
    charges = dict(Charge.objects.values_list("merchant_order_no", "status"))
    assert charges == {
        expiring.merchant_order_no: Charge.Status.CANCELLED,
        fresh.merchant_order_no: Charge.Status.PENDING,
    }
    assert tab.confirm().status_code == 409
    assert Payment.objects.get(pk=started[fresh.pk]["id"]).status == "pending"
    assert not Notification.objects.exists() and not Refund.objects.exists()
    assert balance(wallet) == 5000
    report = ledger_report()
    assert report["ok"], report


@pytest.mark.parametrize("callback_first", [False, True])
def test_a_charge_confirmed_before_the_cancel_is_refunded_once(
    provider, settings, callback_first
):
    """The race the cancel cannot win: the payer confirmed just before. The cancel
    is refused, the success is settled and refunded at once (by the cancel task
    or by the callback, whichever comes first; the other changes nothing)."""
    settings.PROVIDER_CALLBACK_URL = f"{provider}/api/v1/payments/callback"
    user, api, wallet = customer("bob", balance=5000)
    order = place_order(user, amount=3000)
    started = provider_pending(api, order)
    assert PayPage(started["pay_url"]).confirm().status_code == 303
    assert pay(api, order, "balance").status_code == 201

    def deliver_callback() -> None:
        assert notification_deliver(notification_id=Notification.objects.get().pk)
        provider_event_process(event_id=ProviderEvent.objects.get().pk)

    if callback_first:
        deliver_callback()
        assert payment_cancel_open_charges_task(order.pk) == 0  # nothing open
    else:
        assert payment_cancel_open_charges_task(order.pk) == 1
        deliver_callback()
    payment = Payment.objects.get(pk=started["id"])
    assert payment.status == Payment.Status.REFUNDED
    assert Refund.objects.get(payment=payment).reason == "order_already_paid"
    assert Charge.objects.get().status == Charge.Status.SUCCESS
    assert ProviderEvent.objects.get().outcome == "payment refunded"
    assert payment_cancel_open_charges_task(order.pk) == 0  # again: a no-op
    assert_paid_once_from_the_balance(order, wallet, 5000)


def test_the_cancel_task_retries_while_the_provider_is_down(provider, settings):
    user, api, wallet = customer("carol", balance=5000)
    order = place_order(user, amount=1200)
    started = provider_pending(api, order)
    assert pay(api, order, "balance").status_code == 201
    live = settings.PAYMENT_PROVIDER_URL
    settings.PAYMENT_PROVIDER_URL = f"http://127.0.0.1:{free_port()}/provider"
    with pytest.raises(ProviderUnavailable):
        payment_cancel_open_charges_task(order.pk)
    assert issubclass(
        ProviderUnavailable, payment_cancel_open_charges_task.autoretry_for
    )
    assert Payment.objects.get(pk=started["id"]).status == "pending"
    assert Charge.objects.get().status == Charge.Status.PENDING
    settings.PAYMENT_PROVIDER_URL = live
    assert payment_cancel_open_charges_task(order.pk) == 1  # the retry
    assert payment_cancel_open_charges_task(order.pk) == 0  # a redelivery
    assert Payment.objects.get(pk=started["id"]).status == "cancelled"
    assert Charge.objects.get().status == Charge.Status.CANCELLED
    assert_paid_once_from_the_balance(order, wallet, 5000)


def test_cancels_racing_a_confirmation_end_one_way(provider):
    """Three cancel tasks (a redelivery, the re-drive) and the payer's Confirm at
    the same instant: either the charge is cancelled and nothing is collected, or
    the payer won and the money comes back once."""
    user, api, wallet = customer("dora", balance=5000)
    order = place_order(user, amount=900)
    started = provider_pending(api, order)
    tab = PayPage(started["pay_url"])
    assert pay(api, order, "balance").status_code == 201

    def work(i: int):
        if i == 0:
            return tab.confirm().status_code
        return payment_cancel_open_charges_task(order.pk)

    confirmed, *cancels = run_in_threads(4, work)
    assert not any(isinstance(r, Exception) for r in cancels), cancels
    payment = Payment.objects.get(pk=started["id"])
    charge = Charge.objects.get()
    if charge.status == Charge.Status.CANCELLED:
        assert confirmed == 409
        assert payment.status == Payment.Status.CANCELLED
        assert not Notification.objects.exists() and not Refund.objects.exists()
    else:
        assert (confirmed, charge.status) == (303, Charge.Status.SUCCESS)
        assert payment.status == Payment.Status.REFUNDED
        assert Refund.objects.count() == 1
    assert_paid_once_from_the_balance(order, wallet, 5000)
    connection.close()


def test_a_charge_opened_while_the_cancel_asks_the_provider_is_cancelled_too(
    provider, monkeypatch
):
    """The pay request committed its pending payment, then stood; the order is
    cancelled, and its cancel task asks the provider: no charge yet. Before the
    task marks the payment, the pay request opens its charge and records it on the
    payment, still pending then, so it sends no cancel of its own. The task must not
    mark cancelled a payment whose charge it never cancelled: it cancels that
    charge too."""
    user, _, wallet = customer("hal", balance=5000)
    order = place_order(user, amount=1300)
    payment = services.payment_provider_start(order_id=order.pk)
    order_cancel(order_id=order.pk)
    asked = services.provider_charge_cancel

    def pay_request_goes_on_meanwhile(**kwargs):
        answer = asked(**kwargs)
        if Charge.objects.exists():
            return answer
        assert answer is None  # no charge yet
        charge = services.provider_charge_create(
            merchant_order_no=order.merchant_order_no,
            amount=order.amount,
            currency=order.currency,
        )
        services.payment_record_charge(
            payment_id=payment.pk, provider_txn_id=charge.txn_id, pay_url=charge.pay_url
        )
        return answer

    monkeypatch.setattr(
        services, "provider_charge_cancel", pay_request_goes_on_meanwhile
    )
    assert payment_cancel_open_charges_task(order.pk) == 1
    payment.refresh_from_db()
    assert payment.status == Payment.Status.CANCELLED and payment.provider_txn_id
    assert Charge.objects.get().status == Charge.Status.CANCELLED
    assert CANCELLED_NOTE in httpx.get(payment.pay_url).text
    assert payment_cancel_open_charges_task(order.pk) == 0
    assert balance(wallet) == 5000
    report = ledger_report()
    assert report["ok"], report


def test_the_redrive_cancels_the_charge_of_an_order_that_no_longer_takes_money(
    provider,
):
    user, api, wallet = customer("fay", balance=5000)
    paid, cancelled = place_order(user, amount=700), place_order(user, amount=800)
    by_order = {o.pk: provider_pending(api, o) for o in (paid, cancelled)}
    assert pay(api, paid, "balance").status_code == 201  # its task never ran
    order_cancel(order_id=cancelled.pk)
    Payment.objects.update(created_at=timezone.now() - timedelta(hours=1))
    for body in by_order.values():
        assert payment_redrive(payment_id=body["id"]).status == "cancelled"
    assert set(Charge.objects.values_list("status", flat=True)) == {"CANCELLED"}
    assert_paid_once_from_the_balance(paid, wallet, 5000)


def test_a_cancel_task_killed_mid_way_is_redelivered(worker, provider):
    """The worker is SIGKILLed after the provider cancelled the charge and before
    our payment was marked: `acks_late` delivers the task again, the provider's
    cancel answers the same, and the payment ends cancelled."""
    user, api, wallet = customer("gus", balance=5000)
    order = place_order(user, amount=2100)
    started = provider_pending(api, order)
    with row_locked(Payment, started["id"]):
        assert pay(api, order, "balance").status_code == 201
        wait_for(lambda: blocked_on_lock(Payment), what="the task to block mid-way")
        assert Charge.objects.get().status == Charge.Status.CANCELLED
        assert Payment.objects.get(pk=started["id"]).status == "pending"
        victim = pool_child(worker)
        os.kill(victim, signal.SIGKILL)
        wait_for(
            lambda: children(worker.pid) not in ([], [victim]),
            what="a fresh pool process",
        )
    wait_for(
        lambda: Payment.objects.get(pk=started["id"]).status == "cancelled",
        what="the redelivered task",
    )
    assert Charge.objects.get().status == Charge.Status.CANCELLED
    log = worker.log_path.read_text()
    assert "WorkerLostError" in log or "signal 9" in log, log[-2000:]
    assert_paid_once_from_the_balance(order, wallet, 5000)
