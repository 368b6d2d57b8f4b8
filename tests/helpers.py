"""The tests' shared toolkit: customers, orders, keys, the provider's payments and
signed callbacks, and the checks every app's tests make the same way. Real
services, no mocks. (Fixtures are in `conftest.py`,
rows without a story in `factories.py`, processes in `servers.py` and `workers.py`,
the admin's forms in `backoffice.py`.)"""

import itertools
import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection
from django.db.models import Model
from rest_framework.test import APIClient

from ledger.invariants import ledger_report
from ledger.models import Account, JournalEntry
from ledger.services import (
    customer_get_or_create,
    external_account,
    ledger_deposit,
    merchant_account,
)
from orders.models import Order
from orders.services import order_create, preorder_create
from payments.models import Payment, Shipment
from payments.signatures import sign
from tests.factories import PaymentFactory
from tests.servers import free_port

__all__ = [
    "Customer",
    "assert_ledger_ok",
    "assert_problem",
    "assert_settled_once",
    "balance",
    "blocked_on_lock",
    "customer",
    "event_body",
    "free_port",
    "key_taken",
    "new_key",
    "pending_provider_payment",
    "place_order",
    "post_callback",
    "raw",
    "row_locked",
    "wait_for",
]

_keys = itertools.count(1)


def new_key(prefix: str = "key") -> str:
    return f"{prefix}-{next(_keys)}-{uuid.uuid4().hex[:16]}"


def customer(username: str, *, balance: int = 0) -> tuple:
    """(user, API client with the user's token, wallet) with `balance` deposited."""
    user, token, wallet = customer_get_or_create(username=username, currency="CNY")
    if balance:
        ledger_deposit(
            account_id=wallet.pk, amount=balance, reference=f"fund:{wallet.pk}"
        )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return user, client, wallet


def place_order(user, *, amount: int = 1000, description: str = "Tea") -> Order:
    """An order placed as a client places it: a pre-order, then the order."""
    preorder = preorder_create(owner=user)
    return order_create(
        owner=user,
        merchant_order_no=preorder.merchant_order_no,
        amount=amount,
        currency="CNY",
        description=description,
    )


def balance(account: Account) -> int:
    account.refresh_from_db()
    return account.balance


def assert_ledger_ok() -> dict:
    """`check_ledger`'s invariants hold; the report, for a closer look."""
    report = ledger_report()
    assert report["ok"], report["violations"]
    return report


def assert_problem(response: Any, status: int, code: str) -> dict:
    """The response is RFC 9457 problem details with this status and stable `code`
    (a Django test client's response or an httpx one)."""
    content = getattr(response, "content", b"")
    assert response.status_code == status, content
    content_type = response.headers["Content-Type"]
    assert content_type == "application/problem+json", (content_type, content)
    body = response.json()
    assert {"type", "title", "status", "detail", "code"} <= set(body), body
    assert (body["status"], body["code"]) == (status, code), body
    return body


def wait_for(
    condition: Callable[[], Any], seconds: float = 30, what: str = "condition"
) -> None:
    """Poll `condition` until it is true, failing after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} never became true"
        time.sleep(0.05)


@contextmanager
def row_locked(model: type[Model], pk: int) -> Iterator[None]:
    """Hold a row's lock from another connection while the block runs, as a slow
    neighbour would (the application's requests, tasks and workers wait on it)."""
    db = connection.settings_dict
    table = model._meta.db_table
    with psycopg.connect(
        dbname=db["NAME"], user=db["USER"], host=db["HOST"], port=db["PORT"]
    ) as outside:
        outside.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE", [pk])  # noqa: S608
        try:
            yield
        finally:
            outside.rollback()


def blocked_on_lock(model: type[Model] | None = None) -> bool:
    """Some connection to the test database waits for a lock (on `model`'s table,
    when given): the request or task under test is stuck where the test wants it."""
    # (Only the table's name: PostgreSQL keeps the first 1,024 bytes of a query,
    # and a wide table's SELECT ... FOR UPDATE names its columns for longer.)
    pattern = f"%{model._meta.db_table}%" if model else "%"
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query ILIKE %s",
            [pattern],
        )
        return cursor.fetchone()[0] > 0


def key_taken(key: str, seconds: float = 20) -> None:
    """Wait until a request with `key` is past authentication and holds the key in
    the engine: its phased record is committed, or (atomic mode) another session
    holds an advisory lock. (The replay middleware's Redis lock comes before
    authentication: it says nothing about that.)"""
    from idempotency.models import IdempotencyRecord

    def taken() -> bool:
        if IdempotencyRecord.objects.filter(key=key).exists():
            return True
        with connection.cursor() as cursor:
            cursor.execute(  # pg_locks is the whole server's: this database only
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                " AND pid <> pg_backend_pid() AND database ="
                " (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            return cursor.fetchone()[0] > 0

    deadline = time.monotonic() + seconds
    while not taken():
        assert time.monotonic() < deadline, "the first request never took the key"
        time.sleep(0.02)


# -- the provider: its payments and signed callbacks ---------------------------------

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


# -- a customer as the API sees it ----------------------------------------------------


class Customer:
    """A customer with an API token, posting JSON bodies under a key (or none)."""

    def __init__(self, username: str) -> None:
        self.user, self.token, self.wallet = customer_get_or_create(
            username=username, currency="CNY"
        )

    def client(self) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {self.token}")
        return client

    def post(self, path: str, body, key: str | None, client: APIClient | None = None):
        headers = {} if key is None else {"Idempotency-Key": key}
        raw = body if isinstance(body, str) else json.dumps(body)
        return (client or self.client()).post(
            path, raw, content_type="application/json", headers=headers
        )

    def deposits(self) -> int:
        return JournalEntry.objects.filter(postings__account=self.wallet).count()


def gauge(name: str, client: Any = None) -> float:
    """The value of the metric family `name` on `/metrics` (its first sample)."""
    from django.test import Client
    from prometheus_client.parser import text_string_to_metric_families

    text = (client or Client()).get("/metrics").content.decode()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == name]
    return family.samples[0].value


def command_lines(name: str, *args: str) -> tuple[list[dict], Any]:
    """Run a command that prints one JSON line per row it handled: its lines, and
    the CommandError it exited 1 with (None if it exited 0)."""
    from io import StringIO

    from django.core.management import CommandError, call_command

    out = StringIO()
    try:
        call_command(name, *args, stdout=out)
        error = None
    except CommandError as exc:
        assert exc.returncode == 1
        error = exc
    return [json.loads(line) for line in out.getvalue().splitlines()], error
