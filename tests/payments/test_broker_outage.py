"""A broker that is down or does not answer never holds a write request for long,
and beat's re-drive sends what the request could not (`ledger.publishing`).

"Does not answer" is a listener that accepts connections and then says nothing, as a
broker host that drops packets looks to a connection already open: with Celery's and
kombu's defaults a payment waited on it for minutes.
"""

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone
from prometheus_client import REGISTRY

from ledger.celery import app
from ledger.publishing import publish_within
from ledger.services import customer_get_or_create, ledger_deposit
from payments.models import Shipment
from payments.services import DISPATCH_SHIPMENT
from payments.tasks import redrive_inbox
from tests.helpers import place_order, wait_for
from tests.servers import gunicorn
from tests.workers import SETTINGS, broker, celery_worker, point_producer_at

BOUND = 1.0  # seconds a request may take with the broker gone, all told


@contextmanager
def silent_broker() -> Iterator[int]:
    """A port that accepts connections and never reads or answers on them."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        with suppress(OSError):
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
        for connection in held:
            connection.close()


def publishes(outcome: str) -> float:
    labels = {"task": DISPATCH_SHIPMENT, "outcome": outcome}
    return REGISTRY.get_sample_value("celery_publishes_total", labels) or 0.0


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:{port}/0", "amqp://guest:guest@127.0.0.1:{port}//", "refused"],
)
def test_a_publish_gives_up_at_once_and_then_pauses(url):
    before = app.conf.broker_url
    with silent_broker() as port:
        point_producer_at(
            "redis://127.0.0.1:1/0" if url == "refused" else url.format(port=port)
        )
        try:
            failed, skipped = publishes("failed"), publishes("skipped")
            started = time.monotonic()
            assert not publish_within(DISPATCH_SHIPMENT, (1,))
            assert time.monotonic() - started < 0.6
            # The break after a failure: the next request does not wait at all.
            started = time.monotonic()
            assert not publish_within(DISPATCH_SHIPMENT, (2,))
            assert time.monotonic() - started < 0.05
            assert publishes("failed") == failed + 1
            assert publishes("skipped") == skipped + 1
        finally:
            point_producer_at(before)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_payment_answers_at_once_without_its_broker_and_beat_sends_the_task(
    tmp_path, on_postgres
):
    user, token, wallet = customer_get_or_create(username="olga", currency="CNY")
    ledger_deposit(account_id=wallet.pk, amount=5000, reference="fund:olga")
    orders = [place_order(user, amount=700) for _ in range(2)]
    with silent_broker() as port:
        unreachable = {"CELERY_BROKER_URL": f"redis://127.0.0.1:{port}/0"}
        with gunicorn(tmp_path, SETTINGS, **unreachable) as (url, _):
            for order in orders:  # the first waits for the broker, the second not
                started = time.monotonic()
                response = httpx.post(
                    f"{url}/api/v1/orders/{order.merchant_order_no}/pay",
                    json={"method": "balance"},
                    headers={
                        "Authorization": f"Token {token}",
                        "Idempotency-Key": f"pay-{order.pk}",
                    },
                    timeout=30,
                )
                assert response.status_code == 201, response.text
                assert time.monotonic() - started < BOUND
    assert set(Shipment.objects.values_list("status", flat=True)) == {"pending"}

    # Beat's re-drive, once the broker is back: a minute later, every shipment.
    with broker(), celery_worker(tmp_path):
        Shipment.objects.update(created_at=timezone.now() - timedelta(seconds=120))
        assert redrive_inbox() == 2
        wait_for(
            lambda: not Shipment.objects.exclude(status="dispatched").exists(),
            what="the re-driven shipments",
        )
