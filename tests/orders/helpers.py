"""Shared set-up for the orders, payments and browser tests: real services, no mocks."""

import itertools
from datetime import timedelta

import factory
from django.utils import timezone
from rest_framework.test import APIClient

from idempotency.snowflake import next_snowflake
from ledger.models import Account
from ledger.services import customer_get_or_create, ledger_deposit
from orders.models import Order, PreOrder
from orders.services import order_create, preorder_create
from tests.factories import UserFactory

_keys = itertools.count(1)


def new_key(prefix: str = "key") -> str:
    return f"{prefix}-{next(_keys)}-{next_snowflake()}"


class PreOrderFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = PreOrder

    owner = factory.SubFactory(UserFactory)
    merchant_order_no = factory.LazyFunction(lambda: str(next_snowflake()))
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(hours=1))


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


def assert_problem(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert {"type", "title", "status", "detail", "code"} <= set(body)
    assert body["status"] == status and body["code"] == code, body
    return body
