"""The tests' shared toolkit: customers, orders, keys, and the checks every app's
tests make the same way. Real services, no mocks. (Fixtures are in `conftest.py`,
rows without a story in `factories.py`, processes in `servers.py`.)"""

import itertools
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connection
from django.db.models import Model
from rest_framework.test import APIClient

from ledger.models import Account
from ledger.services import customer_get_or_create, ledger_deposit
from orders.models import Order
from orders.services import order_create, preorder_create
from tests.servers import free_port

__all__ = [
    "assert_problem",
    "balance",
    "blocked_on_lock",
    "customer",
    "free_port",
    "new_key",
    "place_order",
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
    pattern = f"%{model._meta.db_table}%FOR UPDATE%" if model else "%"
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query ILIKE %s",
            [pattern],
        )
        return cursor.fetchone()[0] > 0
