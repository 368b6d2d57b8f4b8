"""The callback path through a real Celery worker on the Redis broker (not eager).

Each test starts `celery -A ledger worker` in its own process group on the test
database and kills it at the end; after each, the ledger's invariants hold.
"""

import os
import signal
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.invariants import ledger_report
from ledger.services import merchant_account
from orders.models import Order
from orders.services import order_cancel
from payments.models import Payment, ProviderEvent, Refund, Shipment
from payments.signatures import sign
from payments.tasks import redrive_inbox
from tests.helpers import (
    assert_problem,
    assert_settled_once,
    balance,
    blocked_on_lock,
    customer,
    event_body,
    pending_provider_payment,
    place_order,
    post_callback,
    raw,
    row_locked,
    wait_for,
)
from tests.servers import children
from tests.workers import (
    BROKER_URL,
    broker,
    celery_worker,
    point_producer_at,
    pool_child,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def worker(tmp_path, on_postgres):
    with broker(), celery_worker(tmp_path) as process:
        yield process


def all_processed(count: int) -> bool:
    statuses = list(ProviderEvent.objects.values_list("status", flat=True))
    return len(statuses) == count and set(statuses) == {"processed"}


def dispatched(order: Order) -> bool:
    return Shipment.objects.filter(order=order, status="dispatched").exists()


def test_duplicate_deliveries_and_two_events_settle_once(worker):
    user, _, _ = customer("alice")
    payment = pending_provider_payment(place_order(user, amount=1800))
    first = event_body(payment)
    for _ in range(3):  # the provider delivers at least once
        assert post_callback(first).status_code == 200
    assert post_callback(event_body(payment)).status_code == 200  # another event
    wait_for(lambda: all_processed(2), what="both events processed")
    wait_for(lambda: dispatched(payment.order), what="the shipment task")
    assert_settled_once(payment)


def test_refused_callbacks_change_nothing_while_the_worker_runs(worker, settings):
    user, _, _ = customer("bob")
    payment = pending_provider_payment(place_order(user, amount=1800))
    body = event_body(payment)
    header = sign(secret=settings.PAYMENT_PROVIDER_SECRET, body=raw(body))
    assert post_callback(body, header=header).status_code == 200
    # The same signature replayed as is: refused.
    assert_problem(
        post_callback(body, header=header), 401, "callback_signature_invalid"
    )
    stale = int(time.time()) - 301
    assert_problem(
        post_callback(event_body(payment), timestamp=stale),
        401,
        "callback_signature_invalid",
    )
    assert_problem(
        post_callback(event_body(payment, amount=1)), 400, "callback_mismatch"
    )
    wait_for(lambda: all_processed(1), what="the one valid event")
    assert ProviderEvent.objects.count() == 1
    assert_settled_once(payment)


def test_worker_killed_mid_task_is_redelivered_and_settles_once(worker):
    user, _, _ = customer("carol")
    payment = pending_provider_payment(place_order(user, amount=2200))
    with row_locked(Order, payment.order_id):
        assert post_callback(event_body(payment)).status_code == 200
        # The task is inside its transaction, blocked on the order row: kill it.
        wait_for(lambda: blocked_on_lock(Order), what="the task to block mid-way")
        victim = pool_child(worker)
        os.kill(victim, signal.SIGKILL)
        wait_for(
            lambda: children(worker.pid) not in ([], [victim]),
            what="a fresh pool process",
        )
    # acks_late + reject_on_worker_lost: the message went back to the queue.
    wait_for(lambda: all_processed(1), what="the redelivered task")
    wait_for(lambda: dispatched(payment.order), what="the shipment task")
    assert_settled_once(payment)
    log = worker.log_path.read_text()
    assert "WorkerLostError" in log or "signal 9" in log, log[-2000:]


def test_a_cancelled_orders_late_success_is_refunded(worker):
    user, _, _ = customer("dave")
    payment = pending_provider_payment(place_order(user, amount=900))
    order_cancel(order_id=payment.order_id)
    assert post_callback(event_body(payment)).status_code == 200
    wait_for(lambda: all_processed(1), what="the event")
    payment.refresh_from_db()
    payment.order.refresh_from_db()
    assert payment.status == Payment.Status.REFUNDED
    assert payment.order.status == Order.Status.CANCELLED
    assert Refund.objects.get(payment=payment).reason == "order_cancelled"
    assert balance(merchant_account(currency="CNY")) == 0
    assert not Shipment.objects.exists()
    report = ledger_report()
    assert report["ok"], report


def test_a_callback_stored_while_the_broker_is_down_is_redriven(worker):
    user, _, _ = customer("erin")
    payment = pending_provider_payment(place_order(user, amount=1300))
    point_producer_at("redis://127.0.0.1:1/0")  # nobody listens there
    try:
        response = post_callback(event_body(payment))
    finally:
        point_producer_at(BROKER_URL)
    # Stored and acknowledged although its task could not be sent.
    assert response.status_code == 200, response.content
    event = ProviderEvent.objects.get()
    time.sleep(1)
    event.refresh_from_db()
    assert event.status == "received"
    ProviderEvent.objects.update(received_at=timezone.now() - timedelta(seconds=120))
    assert redrive_inbox() == 1  # what beat runs every minute
    wait_for(lambda: all_processed(1), what="the re-driven event")
    wait_for(lambda: dispatched(payment.order), what="the shipment task")
    assert_settled_once(payment)
