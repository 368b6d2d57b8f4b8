"""A provider delivers at least once, even when the task of a delivery was lost.

Found by `make chaos-cluster`: a charge confirmed while RabbitMQ was restarting
enqueued its delivery into nothing, and the notification waited for ever with no
attempt. Beat now sends again every delivery never tried a minute after it was
created (`redeliver_lost_notifications`); here a live server takes the callback and
stores it, once.
"""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.celery import app
from payments.models import ProviderEvent
from payments.provider.models import Charge, Notification
from payments.provider.services import notifications_lost
from payments.provider.tasks import redeliver_lost_notifications
from tests.factories import ChargeFactory, NotificationFactory
from tests.helpers import pending_provider_payment, place_order
from tests.workers import point_producer_at

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def eager():
    before = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = before


def lost_notification(user, minutes_ago: int) -> tuple:
    payment = pending_provider_payment(place_order(user))
    charge = ChargeFactory.create(
        merchant_order_no=payment.order.merchant_order_no,
        txn_id=payment.provider_txn_id,
        amount=payment.amount,
        status=Charge.Status.SUCCESS,
    )
    note = NotificationFactory.create(charge=charge)
    Notification.objects.filter(pk=note.pk).update(
        created_at=timezone.now() - timedelta(minutes=minutes_ago)
    )
    return payment, note


def test_only_deliveries_never_tried_count_as_lost(user, settings):
    settings.PROVIDER_RETRY_SCALE = 1
    _, old = lost_notification(user, minutes_ago=5)
    lost_notification(user, minutes_ago=0)  # too fresh: its task may yet run
    _, tried = lost_notification(user, minutes_ago=5)
    Notification.objects.filter(pk=tried.pk).update(attempts=1)
    assert notifications_lost(older_than_seconds=60) == [old.pk]


def test_beat_delivers_a_lost_notification_once(user, settings, live_server, eager):
    settings.PROVIDER_CALLBACK_URL = f"{live_server.url}/api/v1/payments/callback"
    _, note = lost_notification(user, minutes_ago=5)
    assert redeliver_lost_notifications.apply().get() == 1
    note.refresh_from_db()
    assert note.delivered_at is not None and note.attempts == 1
    # The merchant has it: stored in its inbox, to be processed like any callback.
    assert ProviderEvent.objects.filter(event_id=note.event_id).count() == 1
    assert redeliver_lost_notifications.apply().get() == 0


def test_a_confirmation_while_the_broker_is_down_is_no_error_page(user, client):
    payment = pending_provider_payment(place_order(user))
    charge = ChargeFactory.create(
        merchant_order_no=payment.order.merchant_order_no,
        txn_id=payment.provider_txn_id,
        amount=payment.amount,
    )
    url = f"/provider/pay/{charge.txn_id}"
    token = re.search(
        r'name="csrfmiddlewaretoken" value="([^"]+)"', client.get(url).text
    )
    assert token
    before = app.conf.broker_url
    point_producer_at("redis://127.0.0.1:1/0")  # nobody listens there
    try:
        confirmed = client.post(
            url, {"csrfmiddlewaretoken": token[1], "action": "confirm"}
        )
    finally:
        point_producer_at(before)
    # The payer sees the confirmation that committed, not an error page; the
    # delivery whose task could not be sent is beat's to send.
    assert confirmed.status_code == 303
    charge.refresh_from_db()
    assert charge.status == Charge.Status.SUCCESS
    note = Notification.objects.get(charge=charge)
    assert note.attempts == 0 and note.delivered_at is None
    Notification.objects.filter(pk=note.pk).update(
        created_at=timezone.now() - timedelta(minutes=5)
    )
    assert notifications_lost(older_than_seconds=60) == [note.pk]
