"""A provider pay request resumed after a pause longer than
PAYMENT_PENDING_TIMEOUT_SECONDS meets beat's re-drive of its payment, which asks
the provider how the payment stands while the retry asks it for the charge. One
outcome, whoever is first: the re-drive never fails a payment whose charge was
recorded.

Over real HTTP: a gunicorn serves our API and the provider simulator; the pay
requests go through the API as a client sends them, the re-drive runs in process.
"""

from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from ledger.models import JournalEntry
from ledger.services import external_account, merchant_account
from orders.models import Order
from payments import services
from payments.models import Payment, Shipment
from payments.provider.models import Charge
from payments.services import payment_redrive, payments_stuck
from tests.conftest import Background
from tests.helpers import (
    assert_ledger_ok,
    balance,
    customer,
    place_order,
)
from tests.payments.test_cancel import PayPage, pay
from tests.payments.test_resumed_pay import cut_off_after_phase_one

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def pause_past_the_timeout(payment: Payment) -> None:
    """The client comes back after a pause longer than the pending timeout: its
    payment is one beat's re-drive asks the provider about."""
    timeout = django_settings.PAYMENT_PENDING_TIMEOUT_SECONDS
    Payment.objects.filter(pk=payment.pk).update(
        created_at=timezone.now() - timedelta(seconds=timeout + 60)
    )


def beat_redrives() -> list[str]:
    """One run of beat's re-drive of pending payments, in process: the statuses it
    left the stuck payments in."""
    stuck = payments_stuck(
        older_than_seconds=django_settings.PAYMENT_PENDING_TIMEOUT_SECONDS
    )
    return [payment_redrive(payment_id=pk).status for pk in stuck]


def assert_replayed(api, order: Order, key: str, first) -> None:
    again = pay(api, order, "provider", key)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert (again.status_code, again.content) == (first.status_code, first.content)


def assert_paid_once_through_the_provider(*orders: Order) -> None:
    """Each order paid once by its provider payment: one settlement each, one
    shipment each, and the money in once."""
    for order in orders:
        order.refresh_from_db()
        assert order.status == Order.Status.PAID
        (paid,) = Payment.objects.filter(order=order, status="succeeded")
        assert JournalEntry.objects.filter(reference=f"provider:{paid.pk}").exists()
        assert Shipment.objects.filter(order=order).count() == 1
    settlements = JournalEntry.objects.filter(reference__startswith="provider:")
    assert settlements.count() == len(orders)
    total = sum(order.amount for order in orders)
    assert balance(merchant_account(currency="CNY")) == total
    assert balance(external_account(currency="CNY")) == -total
    assert_ledger_ok()


def test_the_redrive_does_not_fail_a_payment_whose_charge_its_retry_recorded(
    provider, settings, monkeypatch
):
    """The other way round: the re-drive asks the provider (no charge yet), then
    the retry opens the charge, records it and answers its pay page, and only then
    does the re-drive act on the provider's "no charge". The payment it would fail
    has a charge now: it stays pending, as the answer said, and is paid."""
    user, api, _ = customer("quin")
    order = place_order(user, amount=1550)
    key = cut_off_after_phase_one(api, order, settings)
    stuck = Payment.objects.get(method="provider")
    pause_past_the_timeout(stuck)
    asked = services.provider_charge_get
    answers = []

    def resumed_meanwhile(**kwargs):
        answer = asked(**kwargs)
        assert answer is None
        retry = Background(lambda: pay(customer("quin")[1], order, "provider", key))
        retry.start()
        answers.append(retry.outcome())
        return answer

    monkeypatch.setattr(services, "provider_charge_get", resumed_meanwhile)
    assert beat_redrives() == ["pending"]
    monkeypatch.undo()

    (resumed,) = answers
    assert resumed.status_code == 201, resumed.content
    body = resumed.json()
    assert (body["id"], body["status"]) == (stuck.pk, "pending")
    stuck.refresh_from_db()
    assert stuck.status == Payment.Status.PENDING
    assert (
        stuck.provider_txn_id == body["provider_txn_id"] == Charge.objects.get().txn_id
    )
    assert_replayed(api, order, key, resumed)
    assert beat_redrives() == ["pending"]  # the provider's charge is pending
    assert PayPage(body["pay_url"]).confirm().status_code == 303
    assert beat_redrives() == ["succeeded"]
    assert_paid_once_through_the_provider(order)
