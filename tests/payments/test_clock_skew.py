"""A payment stuck pending is re-driven on time whatever clock its host has.

Found by `make chaos-cluster`: payments made on the host whose clock ran three
minutes fast were stamped three minutes ahead, so the re-drive (which asks the
provider about payments pending longer than PAYMENT_PENDING_TIMEOUT_SECONDS) skipped
them for three minutes more. Payments, refunds, shipments and received callbacks are
now stamped by the database's clock, and the re-drives compare with it. PostgreSQL's
(on SQLite the database's clock is this host's).
"""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from payments.models import ProviderEvent
from payments.services import inbox_stuck, payments_stuck
from tests.helpers import (
    event_body,
    pending_provider_payment,
    place_order,
    post_callback,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def fast_host(monkeypatch, on_postgres) -> None:
    """This host's clock (as the code reads it) runs ten minutes fast."""
    real_now = timezone.now
    monkeypatch.setattr(
        "django.utils.timezone.now", lambda: real_now() + timedelta(minutes=10)
    )


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def test_a_fast_hosts_payment_is_stamped_and_redriven_by_the_database(user, fast_host):
    payment = pending_provider_payment(place_order(user))
    assert abs(payment.created_at - db_now()) < timedelta(seconds=5)
    payment.refresh_from_db()
    assert abs(payment.created_at - db_now()) < timedelta(seconds=5)
    # Pending for "0 s" already, by the database's clock: the re-drive sees it.
    assert payment.pk in payments_stuck(older_than_seconds=0)
    assert payment.pk not in payments_stuck(older_than_seconds=600)


def test_a_fast_hosts_received_callback_is_redriven_by_the_database(user, fast_host):
    payment = pending_provider_payment(place_order(user))
    assert post_callback(event_body(payment)).status_code == 200
    event = ProviderEvent.objects.get()
    assert abs(event.received_at - db_now()) < timedelta(seconds=5)
    ProviderEvent.objects.filter(pk=event.pk).update(
        status=ProviderEvent.Status.RECEIVED
    )
    events, _ = inbox_stuck(older_than_seconds=0)
    assert event.pk in events
