"""Beat's payment chores: re-drive stuck provider payments, cancel unpaid orders."""

import re
from datetime import timedelta

import httpx
import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from ledger.invariants import ledger_report
from ledger.services import merchant_account
from orders.models import Order
from orders.services import order_cancel, order_cancel_expired
from payments.models import Payment, Refund, Shipment
from payments.provider.models import Charge
from payments.services import (
    payment_pay_with_balance,
    payment_redrive,
    payments_stuck,
)
from payments.tasks import cancel_expired_orders, payment_redrive_task
from tests.helpers import balance, customer, new_key, place_order

pytestmark = pytest.mark.django_db


def age(model, pk: int, seconds: int) -> None:
    model.objects.filter(pk=pk).update(
        created_at=timezone.now() - timedelta(seconds=seconds)
    )


def test_unpaid_orders_past_their_expiry_are_cancelled(settings):
    user, _, _ = customer("alice", balance=5000)
    old, fresh, paid = (place_order(user) for _ in range(3))
    payment_pay_with_balance(order_id=paid.pk)
    for order in (old, paid):
        age(Order, order.pk, 7200)
    settings.ORDER_UNPAID_EXPIRY_SECONDS = 3600
    assert cancel_expired_orders() == 1
    assert order_cancel_expired(older_than_seconds=3600) == 0
    statuses = {
        o.pk: o.status for o in Order.objects.filter(pk__in=[old.pk, fresh.pk, paid.pk])
    }
    assert statuses == {
        old.pk: Order.Status.CANCELLED,
        fresh.pk: Order.Status.PENDING_PAYMENT,
        paid.pk: Order.Status.PAID,
    }


def test_only_provider_payments_pending_past_the_timeout_are_stuck():
    user, _, _ = customer("bob", balance=5000)
    order = place_order(user)
    payment = Payment.objects.create(
        order=order, method="provider", amount=order.amount, currency="CNY"
    )
    assert payments_stuck(older_than_seconds=60) == []
    age(Payment, payment.pk, 120)
    assert payments_stuck(older_than_seconds=60) == [payment.pk]


def stuck_provider_payments(user, count: int) -> list[int]:
    """`count` provider payments of `user`'s, pending two minutes, oldest first."""
    made = []
    for _ in range(count):
        order = place_order(user)
        made.append(
            Payment.objects.create(
                order=order, method="provider", amount=order.amount, currency="CNY"
            ).pk
        )
        age(Payment, made[-1], 120)
    return made


def test_every_stuck_payment_is_asked_in_its_turn_however_many_wait():
    """More stuck payments than one run asks about (checkouts left open, each
    still pending at the provider): each run asks about those asked least
    recently, so a later payment is not left out behind the older ones."""
    user, _, _ = customer("dave", balance=5000)
    made = stuck_provider_payments(user, 7)
    runs = [payments_stuck(older_than_seconds=60, limit=3) for _ in range(3)]
    assert runs == [made[0:3], made[3:6], [made[6], made[0], made[1]]]
    # A new one, never asked, comes first.
    (newest,) = stuck_provider_payments(user, 1)
    assert payments_stuck(older_than_seconds=60, limit=3)[0] == newest


@pytest.mark.django_db(transaction=True)
def test_two_re_drives_at_once_share_the_stuck_payments(on_postgres):
    """Two runs picking at the same moment (beats overlapping on a slow
    database): each payment is picked by one of them, not by both."""
    import threading

    from django.db import transaction

    from tests.conftest import Background

    made = stuck_provider_payments(customer("erin", balance=5000)[0], 4)
    taken, go_on = threading.Event(), threading.Event()

    def first_run() -> list[int]:
        with transaction.atomic():
            ids = payments_stuck(older_than_seconds=60, limit=2)
            taken.set()
            assert go_on.wait(30)
        return ids

    first = Background(first_run)
    first.start()
    assert taken.wait(30)
    second = payments_stuck(older_than_seconds=60)
    go_on.set()
    assert first.outcome() == made[:2]
    assert second == made[2:]


def settle_at_provider(pay_url: str, action: str) -> None:
    """The payer's confirmation, whose callback never reaches us (no worker runs)."""
    with httpx.Client(timeout=10) as browser:
        page = browser.get(pay_url)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token, page.text
        browser.post(pay_url, data={"csrfmiddlewaretoken": token[1], "action": action})


def provider_payment(client, order) -> dict:
    response = client.post(
        f"/api/v1/orders/{order.merchant_order_no}/pay",
        {"method": "provider"},
        format="json",
        headers={"Idempotency-Key": new_key()},
    )
    assert response.status_code == 201, response.content
    return response.json()


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_redrive_asks_the_provider_and_settles_once(provider):
    user, client, _ = customer("carol")
    confirmed, waiting, declined, cancelled = (
        place_order(user, amount=400) for _ in range(4)
    )
    bodies = {
        o.pk: provider_payment(client, o)
        for o in (confirmed, waiting, declined, cancelled)
    }
    settle_at_provider(bodies[confirmed.pk]["pay_url"], "confirm")
    settle_at_provider(bodies[declined.pk]["pay_url"], "decline")
    settle_at_provider(bodies[cancelled.pk]["pay_url"], "confirm")
    order_cancel(order_id=cancelled.pk)
    # A payment whose pay request died before it reached the provider.
    lost_order = place_order(user, amount=400)
    lost = Payment.objects.create(
        order=lost_order, method="provider", amount=400, currency="CNY"
    )
    for pk in Payment.objects.values_list("pk", flat=True):
        age(Payment, pk, 3600)
    assert len(payments_stuck(older_than_seconds=60)) == 5
    for pk in payments_stuck(older_than_seconds=60):
        payment_redrive_task(pk)  # what the beat-enqueued task runs
    for pk in Payment.objects.values_list("pk", flat=True):
        payment_redrive(payment_id=pk)  # again: changes nothing
    by_order = {p.order_id: p.status for p in Payment.objects.all()}
    assert by_order == {
        confirmed.pk: "succeeded",
        waiting.pk: "pending",
        declined.pk: "failed",
        cancelled.pk: "refunded",
        lost_order.pk: "failed",
    }
    assert Charge.objects.count() == 4
    confirmed.refresh_from_db()
    assert confirmed.status == Order.Status.PAID
    assert Shipment.objects.filter(order=confirmed).count() == 1
    assert Refund.objects.get().payment.order_id == cancelled.pk
    assert balance(merchant_account(currency="CNY")) == 400
    assert lost.pk in [p.pk for p in Payment.objects.filter(status="failed")]
    report = ledger_report()
    assert report["ok"], report
    assert "payments-redrive-pending" in django_settings.CELERY_BEAT_SCHEDULE
    assert "orders-cancel-expired" in django_settings.CELERY_BEAT_SCHEDULE
