"""A provider pay request resumed after a pause longer than
PAYMENT_PENDING_TIMEOUT_SECONDS meets beat's re-drive of its payment, which asks
the provider how the payment stands while the retry asks it for the charge. One
outcome, whoever is first: the answer never names a payment the re-drive failed,
the re-drive never fails a payment whose charge was recorded, and the charge
opened at the provider is either the order's open payment's or cancelled.

Over real HTTP: a gunicorn serves our API and the provider simulator; the pay
requests go through the API as a client sends them, the re-drive runs in process.
"""

from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from idempotency.models import IdempotencyRecord
from ledger.models import JournalEntry
from ledger.services import external_account, merchant_account
from orders.models import Order
from payments import services
from payments.models import Payment, Shipment
from payments.provider.models import Charge
from payments.services import payment_redrive, payments_stuck
from payments.tasks import payment_cancel_open_charges_task
from tests.conftest import Background, run_in_threads
from tests.helpers import (
    assert_ledger_ok,
    assert_problem,
    balance,
    customer,
    place_order,
)
from tests.payments.test_cancel import PayPage, assert_paid_once_from_the_balance, pay
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


def test_a_payment_failed_while_its_retry_asks_the_provider_is_not_the_answer(
    provider, settings, monkeypatch
):
    """The re-drive asks the provider (no charge yet) and fails the payment while
    the retry asks the provider for the charge. The retry records the charge on
    the order's payment opened again, as a fresh request would (the provider
    dedupes by merchant order number: the same charge), and answers its pay page:
    never a `201` naming the failed payment."""
    user, api, _ = customer("ora")
    order = place_order(user, amount=1350)
    key = cut_off_after_phase_one(api, order, settings)
    stuck = Payment.objects.get(method="provider")
    pause_past_the_timeout(stuck)
    charge_create = services.provider_charge_create

    def failed_meanwhile(**kwargs):
        redrive = Background(beat_redrives)
        redrive.start()
        assert redrive.outcome() == ["failed"]  # the provider had no charge
        return charge_create(**kwargs)

    monkeypatch.setattr(services, "provider_charge_create", failed_meanwhile)
    resumed = pay(api, order, "provider", key)
    monkeypatch.undo()

    assert resumed.status_code == 201, resumed.content
    body = resumed.json()
    assert (body["status"], body["order"]) == ("pending", order.merchant_order_no)
    assert body["id"] != stuck.pk and body["pay_url"]
    charge = Charge.objects.get()
    assert (charge.status, charge.txn_id) == ("PENDING", body["provider_txn_id"])
    stuck.refresh_from_db()
    assert (stuck.status, stuck.provider_txn_id, stuck.pay_url) == ("failed", "", "")
    assert Payment.objects.get(status="pending").pk == body["id"]
    assert_replayed(api, order, key, resumed)
    # The payer pays the charge the answer showed: it settles that payment, once.
    assert PayPage(body["pay_url"]).confirm().status_code == 303
    assert payment_redrive(payment_id=body["id"]).status == "succeeded"
    assert payment_redrive(payment_id=stuck.pk).status == "failed"
    assert_paid_once_through_the_provider(order)


def test_a_charge_for_an_order_paid_after_the_redrive_failed_it_is_cancelled(
    provider, settings, monkeypatch
):
    """As above, and the order is paid from the balance once the re-drive failed
    its payment (no provider payment was open then: the balance payment sends no
    cancel). The retry records the charge on the failed payment, sends its
    cancel as for a charge opened after a cancel, and answers the refusal a fresh
    request would get."""
    user, api, wallet = customer("pam", balance=5000)
    order = place_order(user, amount=1450)
    key = cut_off_after_phase_one(api, order, settings)
    stuck = Payment.objects.get(method="provider")
    pause_past_the_timeout(stuck)
    charge_create = services.provider_charge_create

    def failed_and_paid_meanwhile(**kwargs):
        def redrive_then_pay() -> None:
            assert beat_redrives() == ["failed"]
            assert pay(customer("pam")[1], order, "balance").status_code == 201

        meanwhile = Background(redrive_then_pay)
        meanwhile.start()
        assert meanwhile.outcome() is None
        return charge_create(**kwargs)

    monkeypatch.setattr(services, "provider_charge_create", failed_and_paid_meanwhile)
    refused = pay(api, order, "provider", key)
    monkeypatch.undo()

    body = assert_problem(refused, 409, "order_already_paid")
    assert "pay_url" not in body
    record = IdempotencyRecord.objects.get(key=key)
    assert (record.status, record.response_status) == ("failed", 409)
    assert_replayed(api, order, key, refused)
    stuck.refresh_from_db()
    assert stuck.status == Payment.Status.FAILED
    assert stuck.provider_txn_id == Charge.objects.get().txn_id
    assert stuck.charge_cancel == Payment.ChargeCancel.PENDING
    assert Charge.objects.get().status == Charge.Status.PENDING
    # What the record's commit sent; beat sends it again while it is pending.
    assert services.charges_to_cancel(older_than_seconds=0) == [order.pk]
    payment_cancel_open_charges_task(order.pk)
    assert Charge.objects.get().status == Charge.Status.CANCELLED
    stuck.refresh_from_db()
    assert (stuck.status, stuck.charge_cancel) == ("failed", "confirmed")
    assert services.charges_to_cancel(older_than_seconds=0) == []
    assert_paid_once_from_the_balance(order, wallet, 5000)


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


def test_a_resumed_pay_request_racing_the_redrive_ends_one_way(provider, settings):
    """The retry and the re-drive from real threads at the same instant, a few
    times over: whoever is first, the answer is a `201` naming the order's one
    pending payment with the provider's charge recorded on it, a payment the
    re-drive failed has no charge, and the payer's confirmation settles the order
    once."""
    user, api, _ = customer("rue")
    orders = []
    for round_ in range(4):
        order = place_order(user, amount=1600 + round_)
        key = cut_off_after_phase_one(api, order, settings)
        stuck = Payment.objects.get(order=order)
        pause_past_the_timeout(stuck)

        def work(i: int, order=order, key=key, stuck=stuck):
            if i == 0:
                return pay(customer("rue")[1], order, "provider", key)
            return payment_redrive(payment_id=stuck.pk).status

        retried, redriven = run_in_threads(2, work)
        assert retried.status_code == 201, retried.content
        body = retried.json()
        assert body["status"] == "pending" and body["pay_url"]
        assert redriven in ("pending", "failed"), redriven
        assert (body["id"] != stuck.pk) == (redriven == "failed")
        charge = Charge.objects.get(merchant_order_no=order.merchant_order_no)
        assert charge.status == Charge.Status.PENDING
        (open_,) = Payment.objects.filter(order=order, status="pending")
        assert (open_.pk, open_.provider_txn_id) == (body["id"], charge.txn_id)
        assert not Payment.objects.filter(order=order, status="failed").exclude(
            provider_txn_id=""
        )
        assert_replayed(api, order, key, retried)
        assert PayPage(body["pay_url"]).confirm().status_code == 303
        for payment in Payment.objects.filter(order=order):
            payment_redrive(payment_id=payment.pk)
        orders.append(order)
    assert_paid_once_through_the_provider(*orders)
