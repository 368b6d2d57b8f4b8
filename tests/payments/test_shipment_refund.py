"""A refunded order ships nothing: the refund, under the order's lock, cancels its
shipment if the warehouse has not been handed it yet, so the dispatch task (late,
redelivered, or sent again by beat's inbox re-drive) finds nothing to send."""

import time

import pytest
from django.db import transaction

from payments.models import Shipment
from payments.services import (
    inbox_stuck,
    payment_pay_with_balance,
    payment_refund,
    payment_settle,
    shipment_dispatch,
)
from payments.tasks import shipment_dispatch_task
from tests.conftest import run_in_threads
from tests.helpers import (
    assert_ledger_ok,
    customer,
    pending_provider_payment,
    place_order,
)

pytestmark = pytest.mark.django_db


def paid(username: str = "alice", amount: int = 1500):
    user, _, _ = customer(username, balance=5000)
    order = place_order(user, amount=amount)
    with transaction.atomic():
        payment = payment_pay_with_balance(order_id=order.pk)
    return order, payment


def test_a_refund_before_the_dispatch_cancels_the_shipment():
    order, payment = paid()
    with transaction.atomic():
        payment_refund(payment_id=payment.pk)
    shipment = Shipment.objects.get(order=order)
    # The dispatch task, late or delivered again, sends nothing; beat no longer
    # re-drives it.
    assert shipment_dispatch_task.apply(args=[shipment.pk]).get() is False
    assert shipment_dispatch(shipment_id=shipment.pk) is False
    shipment.refresh_from_db()
    assert (shipment.status, shipment.dispatched_at) == ("cancelled", None)
    assert shipment.pk not in inbox_stuck(older_than_seconds=-3600)[1]
    assert_ledger_ok()


def test_a_refund_after_the_dispatch_leaves_the_shipment_dispatched():
    order, payment = paid()
    shipment = Shipment.objects.get(order=order)
    assert shipment_dispatch(shipment_id=shipment.pk) is True
    with transaction.atomic():
        payment_refund(payment_id=payment.pk)
    assert Shipment.objects.get(pk=shipment.pk).status == Shipment.Status.DISPATCHED


def test_a_late_success_refunded_keeps_the_other_payments_shipment():
    """A provider success for an order already paid from the wallet is refunded,
    but the order stays paid: its shipment still goes out."""
    order, _ = paid()
    late = pending_provider_payment(order, txn="P-late")
    with transaction.atomic():
        payment_settle(payment_id=late.pk, provider_txn_id="P-late")
    late.refresh_from_db()
    assert late.status == "refunded"
    shipment = Shipment.objects.get(order=order)
    assert shipment.status == Shipment.Status.PENDING
    assert shipment_dispatch(shipment_id=shipment.pk) is True


@pytest.mark.django_db(transaction=True)
def test_a_dispatch_racing_a_refund_never_ships_a_refunded_order(on_postgres):
    for round_ in range(5):
        order, payment = paid(f"shopper{round_}")
        shipment = Shipment.objects.get(order=order)

        def work(i: int, shipment=shipment, payment=payment, round_=round_):
            if i == 0:
                with transaction.atomic(durable=True):
                    return payment_refund(payment_id=payment.pk)
            # Later rounds let the refund get further first.
            time.sleep(0.02 * round_)
            return shipment_dispatch(shipment_id=shipment.pk)

        results = run_in_threads(4, work)
        assert not [r for r in results if isinstance(r, Exception)], results
        shipment.refresh_from_db()
        dispatched = [r for r in results[1:] if r is True]
        # Either the warehouse got it before the refund (once), or never.
        if shipment.status == Shipment.Status.DISPATCHED:
            assert len(dispatched) == 1
        else:
            assert shipment.status == Shipment.Status.CANCELLED
            assert dispatched == []
    assert_ledger_ok()


def test_a_shipment_left_pending_by_an_earlier_refund_is_cancelled_not_sent():
    """Orders refunded before refunds cancelled their shipment (or by a process of
    the release before, during a rolling deploy) kept it pending: beat's re-drive
    sends its dispatch, which cancels it instead of shipping a refunded order."""
    order, payment = paid()
    with transaction.atomic():
        payment_refund(payment_id=payment.pk)
    Shipment.objects.filter(order=order).update(status=Shipment.Status.PENDING)
    shipment = Shipment.objects.get(order=order)
    assert shipment_dispatch_task.apply(args=[shipment.pk]).get() is False
    shipment.refresh_from_db()
    assert (shipment.status, shipment.dispatched_at) == ("cancelled", None)
    assert shipment.pk not in inbox_stuck(older_than_seconds=-3600)[1]
