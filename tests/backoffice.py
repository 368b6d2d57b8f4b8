"""Pressing the admin's action buttons as staff do: open the action's form, then
apply it (as often, and from as many threads, as a test likes)."""

import html
import re
from datetime import timedelta
from typing import Any

from django.test import Client
from django.utils import timezone

from idempotency.models import IdempotencyRecord
from idempotency.records import Call
from ledger.services import account_freeze, account_unfreeze, merchant_account
from payments.models import Payment, ProviderEvent
from payments.services import payment_pay_with_balance
from payments.tasks import provider_event_process_task
from tests.factories import IdempotencyRecordFactory
from tests.helpers import (
    customer,
    event_body,
    pending_provider_payment,
    place_order,
    post_callback,
)

TOKEN = re.compile(r'name="token" value="([0-9a-f]{32})"')


def staff(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def open_action(client: Client, changelist: str, action: str, ids: list[int]):
    """The action's page (its form), as the changelist's Go button leads to it: a
    303 to a URL that names the selection and a fresh one-time token."""
    response = client.post(
        changelist, {"action": action, "_selected_action": ids}, follow=True
    )
    assert response.redirect_chain, response.status_code
    assert response.redirect_chain[0][1] == 303
    return response


def token_of(page) -> str:
    match = TOKEN.search(page.content.decode())
    assert match, page.content.decode()[:2000]
    return match.group(1)


def action_url(changelist: str, action: str, ids: list[int]) -> str:
    return f"{changelist}backoffice/{action}/?ids={','.join(map(str, ids))}"


def apply_action(
    client: Client, changelist: str, action: str, ids: list[int], **fields: Any
):
    """Submit the action's form; follows the 303 back to the list."""
    return client.post(action_url(changelist, action, ids), fields, follow=True)


MESSAGE = re.compile(r'<li class="(?:success|info|warning|error)">(.*?)</li>', re.S)


def messages_of(response) -> list[str]:
    """The messages the page showed, read from the page itself (a response's
    `context` is not to be trusted when other threads render templates too)."""
    return [
        html.unescape(m).strip() for m in MESSAGE.findall(response.content.decode())
    ]


def stuck(**values) -> IdempotencyRecord:
    """A phased request that died before its first recovery point."""
    return IdempotencyRecordFactory.create(
        endpoint="orders.pay",
        path="/api/v1/orders/1/pay",
        status=IdempotencyRecord.Status.PROCESSING,
        response_status=None,
        response_body=None,
        recovery_point="started",
        locked_until=timezone.now() - timedelta(minutes=5),
        **values,
    )


def call_of(record: IdempotencyRecord) -> Call:
    """A retry of `record`'s request, as the engine describes it."""
    return Call(
        scope=record.scope,
        key=record.key,
        endpoint=record.endpoint,
        method="POST",
        path=record.path,
        fingerprint=record.fingerprint,
        fields={},
    )


def parked_event(max_attempts: int) -> tuple[ProviderEvent, Payment, object]:
    """A late provider success for an order paid from the balance meanwhile, parked
    because the merchant account was frozen; the account is active again."""
    user, _, wallet = customer("bob", balance=5000)
    order = place_order(user, amount=2500)
    payment = pending_provider_payment(order)
    payment_pay_with_balance(order_id=order.pk)
    merchant = merchant_account(currency="CNY")
    account_freeze(account_id=merchant.pk)
    assert post_callback(event_body(payment)).status_code == 200
    event = ProviderEvent.objects.get()
    for _ in range(max_attempts):
        provider_event_process_task(event.pk)
    event.refresh_from_db()
    assert event.status == ProviderEvent.Status.PARKED
    account_unfreeze(account_id=merchant.pk)
    return event, payment, wallet
