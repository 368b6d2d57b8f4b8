"""Signed provider callbacks and provider payments, and how the tests check them."""

import itertools
import json
import time

from django.conf import settings
from rest_framework.test import APIClient

from ledger.invariants import ledger_report
from ledger.services import external_account, merchant_account
from orders.models import Order
from payments.models import Payment, Shipment
from payments.signatures import sign
from tests.factories import PaymentFactory
from tests.helpers import balance

_events = itertools.count(1)


def pending_provider_payment(order: Order, txn: str = "") -> Payment:
    """A provider payment as phase 3 of the pay request leaves it."""
    extra = {"provider_txn_id": txn} if txn else {}
    return PaymentFactory.create(order=order, **extra)


def event_body(payment: Payment, **overrides) -> dict:
    body = {
        "event_id": f"evt-{next(_events)}-{time.time_ns()}",
        "merchant_order_no": payment.order.merchant_order_no,
        "provider_txn_id": payment.provider_txn_id,
        "status": "SUCCESS",
        "amount": payment.amount,
    }
    body.update(overrides)
    return body


def raw(body) -> bytes:
    return json.dumps(body).encode() if not isinstance(body, bytes) else body


def post_callback(
    body, *, url: str = "", header: str | None = None, timestamp=None, secret=None
):
    """POST a callback signed now with a fresh nonce (or with `header` as given)."""
    data = raw(body)
    if header is None:
        header = sign(
            secret=secret or settings.PAYMENT_PROVIDER_SECRET,
            body=data,
            timestamp=timestamp,
        )
    headers = {"X-Provider-Signature": header} if header else {}
    if url:
        import httpx

        return httpx.post(
            f"{url}/api/v1/payments/callback",
            content=data,
            headers={**headers, "Content-Type": "application/json"},
            timeout=10,
        )
    return APIClient().post(
        "/api/v1/payments/callback",
        data,
        content_type="application/json",
        headers=headers,
    )


def assert_settled_once(payment: Payment) -> None:
    """The provider's money came in exactly once: payment, order, balances, shipment."""
    payment.refresh_from_db()
    payment.order.refresh_from_db()
    assert payment.status == Payment.Status.SUCCEEDED
    assert payment.order.status == Order.Status.PAID
    assert balance(merchant_account(currency="CNY")) == payment.amount
    assert balance(external_account(currency="CNY")) == -payment.amount
    assert Shipment.objects.filter(order=payment.order).count() == 1
    report = ledger_report()
    assert report["ok"], report
