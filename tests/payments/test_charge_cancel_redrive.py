"""A charge opened for a payment already cancelled is cancelled at the provider even
when the task its record sent is lost: the payment says `charge_cancel: pending`
until the provider confirms the cancel, and beat's inbox re-drive sends the task
again a minute later, as it does for a refund to return.

Over real HTTP: a gunicorn serves our API and the provider simulator; the task
runs in a real Celery worker, or in process where the test says so.
"""

from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from ledger.invariants import ledger_report
from payments import services
from payments.exceptions import ProviderUnavailable
from payments.models import Payment, Refund
from payments.provider.models import Charge
from payments.services import charges_to_cancel
from payments.tasks import payment_cancel_open_charges_task, redrive_inbox
from tests.conftest import Background, run_in_threads
from tests.helpers import assert_problem, customer, new_key, place_order, wait_for
from tests.payments.test_cancel import (
    CANCELLED_NOTE,
    PayPage,
    assert_paid_once_from_the_balance,
    pay,
    provider_pending,
)
from tests.servers import free_port
from tests.workers import BROKER_URL, point_producer_at

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

UNREACHABLE = "redis://127.0.0.1:1/0"  # refuses connections: a broker down


def charge_opened_after_the_cancel(monkeypatch, username: str) -> tuple:
    """The order is paid from the balance, and its cancel finds no charge, while
    the provider pay request asks the provider for one; the request records the
    charge on its cancelled payment (and is refused). (order, wallet, payment)."""
    user, api, wallet = customer(username, balance=5000)
    order = place_order(user, amount=1400)
    charge_create = services.provider_charge_create

    def paid_meanwhile(**kwargs):
        def pay_from_the_balance() -> None:
            assert pay(customer(username)[1], order, "balance").status_code == 201
            assert payment_cancel_open_charges_task(order.pk) == 1  # no charge yet

        meanwhile = Background(pay_from_the_balance)
        meanwhile.start()
        assert meanwhile.outcome() is None
        return charge_create(**kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(services, "provider_charge_create", paid_meanwhile)
        assert_problem(pay(api, order, "provider"), 409, "order_already_paid")
    payment = Payment.objects.get(method="provider")
    assert payment.status == Payment.Status.CANCELLED and payment.provider_txn_id
    assert payment.charge_cancel == Payment.ChargeCancel.PENDING
    assert Charge.objects.get().status == Charge.Status.PENDING  # open, for now
    return order, wallet, payment


def a_minute_later(payment: Payment, minutes: int = 2) -> None:
    Payment.objects.filter(pk=payment.pk).update(
        updated_at=timezone.now() - timedelta(minutes=minutes)
    )


def assert_cancel_confirmed(payment: Payment) -> None:
    payment.refresh_from_db()
    assert payment.status == Payment.Status.CANCELLED
    assert payment.charge_cancel == Payment.ChargeCancel.CONFIRMED
    assert payment.charge_cancelled_at is not None
    assert Charge.objects.get().status == Charge.Status.CANCELLED
    assert charges_to_cancel(older_than_seconds=0) == []
    assert CANCELLED_NOTE in httpx.get(payment.pay_url).text


def test_a_lost_cancel_is_sent_again_by_beat_through_the_worker(
    worker, provider, monkeypatch
):
    """The broker is down when the pay request commits: its cancel is dropped (the
    request does not wait). A minute later beat's re-drive sends it again and the
    worker cancels the charge; the stale pay page can no longer take money."""
    point_producer_at(UNREACHABLE)
    try:
        order, wallet, payment = charge_opened_after_the_cancel(monkeypatch, "nia")
    finally:
        point_producer_at(BROKER_URL)
    tab = PayPage(payment.pay_url)
    assert charges_to_cancel(older_than_seconds=60) == []  # not a minute yet
    a_minute_later(payment)
    assert charges_to_cancel(older_than_seconds=60) == [order.pk]
    assert redrive_inbox() == 1
    wait_for(
        lambda: Payment.objects.get(pk=payment.pk).charge_cancel == "confirmed",
        what="the re-driven cancel",
    )
    assert_cancel_confirmed(payment)
    assert tab.confirm().status_code == 409
    assert redrive_inbox() == 0
    assert_paid_once_from_the_balance(order, wallet, 5000)
    assert not ledger_report()["warnings"]


def test_the_cancel_sent_again_is_confirmed_once(provider, monkeypatch):
    """The record's task and beat's re-drives, run again and by six threads at
    once: the charge is cancelled, the confirmation written once."""
    order, wallet, payment = charge_opened_after_the_cancel(monkeypatch, "otto")
    a_minute_later(payment)
    results = run_in_threads(6, lambda i: payment_cancel_open_charges_task(order.pk))
    assert results == [0] * 6, results  # the payment was cancelled already
    assert_cancel_confirmed(payment)
    confirmed_at = Payment.objects.get(pk=payment.pk).charge_cancelled_at
    assert payment_cancel_open_charges_task(order.pk) == 0  # a redelivery
    assert Payment.objects.get(pk=payment.pk).charge_cancelled_at == confirmed_at
    assert_paid_once_from_the_balance(order, wallet, 5000)


def test_a_cancel_racing_the_payers_confirmation_ends_one_way(
    provider, monkeypatch, settings
):
    """Beat's re-sent cancels and the payer's Confirm on the stale pay page at
    the same instant: either the charge is cancelled (and confirmed here) or the
    payer won, and the money comes back once; nothing is left to re-drive."""
    settings.PROVIDER_CALLBACK_URL = "http://127.0.0.1:1/unused"
    order, wallet, payment = charge_opened_after_the_cancel(monkeypatch, "pia")
    tab = PayPage(payment.pay_url)

    def work(i: int):
        if i == 0:
            return tab.confirm().status_code
        return payment_cancel_open_charges_task(order.pk)

    confirmed, *cancels = run_in_threads(4, work)
    assert not any(isinstance(r, Exception) for r in cancels), cancels
    payment.refresh_from_db()
    charge = Charge.objects.get()
    if charge.status == Charge.Status.CANCELLED:
        assert confirmed == 409
        assert payment.charge_cancel == Payment.ChargeCancel.CONFIRMED
        assert not Refund.objects.exists()
    else:
        assert (confirmed, charge.status) == (303, Charge.Status.SUCCESS)
        assert payment.status == Payment.Status.REFUNDED
        assert Refund.objects.get().reason == "order_already_paid"
    assert charges_to_cancel(older_than_seconds=0) == []
    assert_paid_once_from_the_balance(order, wallet, 5000)


def test_a_cancel_the_provider_does_not_take_is_named_after_ten_minutes(
    provider, monkeypatch, settings
):
    """The provider is down: the task fails (and retries), the payment stays
    pending for beat, and `check_ledger` names it ten minutes on; once the
    provider answers, the warning goes."""
    order, wallet, payment = charge_opened_after_the_cancel(monkeypatch, "quin")
    live = settings.PAYMENT_PROVIDER_URL
    settings.PAYMENT_PROVIDER_URL = f"http://127.0.0.1:{free_port()}/provider"
    with pytest.raises(ProviderUnavailable):
        payment_cancel_open_charges_task(order.pk)
    payment.refresh_from_db()
    assert payment.charge_cancel == Payment.ChargeCancel.PENDING
    a_minute_later(payment)
    assert ledger_report()["warnings"] == []
    a_minute_later(payment, minutes=11)
    report = ledger_report()
    assert report["ok"], report
    assert report["warnings"] == [
        f"payment {payment.pk} (order {order.merchant_order_no}): its charge is "
        "not yet cancelled by the provider"
    ]
    settings.PAYMENT_PROVIDER_URL = live
    assert redrive_inbox() == 1
    payment_cancel_open_charges_task(order.pk)  # what the re-drive sent
    assert_cancel_confirmed(payment)
    assert ledger_report()["warnings"] == []
    assert_paid_once_from_the_balance(order, wallet, 5000)


def test_a_cancel_confirmed_first_time_leaves_nothing_to_redrive(provider):
    """The usual way: the order is paid from the balance while its charge is open;
    the task cancels the charge and our payment, confirmed at once. A payment
    cancelled before this release (nothing recorded of its cancel) is not sent
    again."""
    user, api, wallet = customer("rex", balance=5000)
    order = place_order(user, amount=1300)
    started = provider_pending(api, order)
    assert pay(api, order, "balance").status_code == 201
    assert payment_cancel_open_charges_task(order.pk) == 1
    payment = Payment.objects.get(pk=started["id"])
    assert_cancel_confirmed(payment)

    Payment.objects.filter(pk=payment.pk).update(
        charge_cancel=Payment.ChargeCancel.NONE, charge_cancelled_at=None
    )  # as the migration leaves a payment cancelled before it
    a_minute_later(payment, minutes=60)
    assert charges_to_cancel(older_than_seconds=60) == []
    assert redrive_inbox() == 0
    assert not ledger_report()["warnings"]
    assert_paid_once_from_the_balance(order, wallet, 5000)


def test_the_task_for_an_order_with_nothing_to_cancel_changes_nothing(provider):
    """Bad input: the re-drive's task for an order with nothing to cancel, or one
    that may still be paid, changes nothing."""
    user, api, _ = customer("sam", balance=5000)
    order = place_order(user, amount=1200)
    started = provider_pending(api, order)
    assert payment_cancel_open_charges_task(order.pk) == 0  # it still takes money
    assert Payment.objects.get(pk=started["id"]).charge_cancel == ""
    paid = place_order(user, amount=1100)
    assert pay(api, paid, "balance", new_key()).status_code == 201
    assert payment_cancel_open_charges_task(paid.pk) == 0  # no provider payment
    assert Charge.objects.get().status == Charge.Status.PENDING
