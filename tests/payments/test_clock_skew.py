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
from payments.signatures import nonce_purge_expired, sign
from tests.helpers import (
    assert_problem,
    event_body,
    pending_provider_payment,
    place_order,
    post_callback,
    raw,
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


def test_a_nonce_outlives_its_window_whatever_the_hosts_clocks(
    user, monkeypatch, settings, on_postgres
):
    """A callback received on a host six minutes slow, its nonce purged by a beat
    host six minutes fast: by their own clocks it expired twelve minutes early,
    inside the ten minutes a replay of it passes the timestamp check, and the
    replay was accepted (200). Nonces are stamped and purged by the database's
    clock: the replay is refused."""
    payment = pending_provider_payment(place_order(user))
    body = event_body(payment)
    header = sign(secret=settings.PAYMENT_PROVIDER_SECRET, body=raw(body))
    real_now = timezone.now

    def host_clock(skew: timedelta) -> None:
        monkeypatch.setattr("django.utils.timezone.now", lambda: real_now() + skew)

    host_clock(timedelta(minutes=-6))
    assert post_callback(body, header=header).status_code == 200
    host_clock(timedelta(minutes=6))
    assert nonce_purge_expired() == 0
    monkeypatch.setattr("django.utils.timezone.now", real_now)
    assert_problem(
        post_callback(body, header=header), 401, "callback_signature_invalid"
    )


def test_a_fast_beat_host_does_not_expire_holds_early(user, monkeypatch, on_postgres):
    """A hold authorized for five minutes, and beat's expiry run on a worker whose
    clock is ten minutes fast: by the worker's clock it had expired, and the
    payment was voided five minutes before the `expires_at` its client was told.
    Whether a hold has expired is the database's clock's to say."""
    from django.db import transaction

    from ledger.services import ledger_deposit, wallet_get_or_create
    from payments.services import payment_authorize_with_balance, payment_capture
    from payments.tasks import expire_holds

    wallet = wallet_get_or_create(owner_id=user.pk, currency="CNY")
    ledger_deposit(account_id=wallet.pk, amount=5000, reference="skew:deposit")
    order = place_order(user, amount=1000)
    with transaction.atomic():
        payment = payment_authorize_with_balance(order_id=order.pk, hold_seconds=300)
    real_now = timezone.now
    monkeypatch.setattr(
        "django.utils.timezone.now", lambda: real_now() + timedelta(minutes=10)
    )
    assert expire_holds() == 0
    monkeypatch.setattr("django.utils.timezone.now", real_now)
    with transaction.atomic():
        captured = payment_capture(payment_id=payment.pk)
    assert captured.status == "succeeded"


def test_a_fast_beat_host_does_not_cancel_unpaid_orders_early(
    user, monkeypatch, settings, on_postgres
):
    """An order placed 55 minutes ago, unpaid orders cancelled after an hour, and
    beat's expiry run on a worker whose clock is ten minutes fast: by the worker's
    clock the hour had passed, and the order was cancelled five minutes early.
    Orders are stamped, and the expiry compares, by the database's clock."""
    from orders.models import Order
    from payments.tasks import cancel_expired_orders

    settings.ORDER_UNPAID_EXPIRY_SECONDS = 3600
    order = place_order(user)
    assert abs(Order.objects.get(pk=order.pk).created_at - db_now()) < timedelta(
        seconds=5
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE orders_order SET created_at = clock_timestamp() - "
            "interval '55 minutes' WHERE id = %s",
            [order.pk],
        )
    real_now = timezone.now
    monkeypatch.setattr(
        "django.utils.timezone.now", lambda: real_now() + timedelta(minutes=10)
    )
    assert cancel_expired_orders() == 0
    assert Order.objects.get(pk=order.pk).status == Order.Status.PENDING_PAYMENT
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE orders_order SET created_at = clock_timestamp() - "
            "interval '61 minutes' WHERE id = %s",
            [order.pk],
        )
    assert cancel_expired_orders() == 1


def test_a_slow_hosts_hold_lasts_as_long_as_asked(user, monkeypatch, on_postgres):
    """A hold authorized for five minutes on a web host whose clock is ten minutes
    slow: stamped by that clock, it had expired five minutes before it was made, by
    the database's clock that decides its expiry, so beat expired it at once and
    the capture was refused. It is stamped by the database's clock too."""
    from django.db import transaction

    from ledger.services import ledger_deposit, wallet_get_or_create
    from payments.services import payment_authorize_with_balance, payment_capture
    from payments.tasks import expire_holds

    wallet = wallet_get_or_create(owner_id=user.pk, currency="CNY")
    ledger_deposit(account_id=wallet.pk, amount=5000, reference="skew:deposit")
    order = place_order(user, amount=1000)
    real_now = timezone.now
    monkeypatch.setattr(
        "django.utils.timezone.now", lambda: real_now() - timedelta(minutes=10)
    )
    with transaction.atomic():
        payment = payment_authorize_with_balance(order_id=order.pk, hold_seconds=300)
    monkeypatch.setattr("django.utils.timezone.now", real_now)
    payment.hold.refresh_from_db()
    lasts = payment.hold.expires_at - db_now()
    assert timedelta(seconds=295) < lasts <= timedelta(seconds=300)
    assert expire_holds() == 0
    with transaction.atomic():
        captured = payment_capture(payment_id=payment.pk)
    assert captured.status == "succeeded"
