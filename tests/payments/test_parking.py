"""A provider callback that keeps failing for a business reason is parked, never
dropped, and processed once when an operator re-drives it.

The business reason here is a frozen merchant account: a late success for an order
paid from the balance must be refunded, and money cannot leave a frozen account.
"""

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from ledger.invariants import ledger_report
from ledger.models import JournalEntry
from ledger.services import (
    account_freeze,
    account_unfreeze,
    external_account,
    merchant_account,
)
from orders.models import Order
from payments import services
from payments.models import Payment, ProviderEvent, Refund
from payments.services import (
    inbox_stuck,
    payment_pay_with_balance,
    provider_event_process,
    provider_event_redrive,
)
from payments.tasks import provider_event_process_task, redrive_inbox
from tests.conftest import run_in_threads
from tests.helpers import (
    balance,
    command_lines,
    customer,
    event_body,
    gauge,
    pending_provider_payment,
    place_order,
    post_callback,
)

pytestmark = pytest.mark.django_db

MAX_ATTEMPTS = 3


@pytest.fixture(autouse=True)
def _max_attempts(settings):
    settings.PROVIDER_EVENT_MAX_ATTEMPTS = MAX_ATTEMPTS


@pytest.fixture
def late_success():
    """A success for an order paid from the balance meanwhile, stored while the
    merchant account is frozen: its automatic refund cannot take the money out."""
    user, _, wallet = customer("alice", balance=5000)
    order = place_order(user, amount=2500)
    payment = pending_provider_payment(order)
    payment_pay_with_balance(order_id=order.pk)
    merchant = merchant_account(currency="CNY")
    account_freeze(account_id=merchant.pk)
    body = event_body(payment)
    assert post_callback(body).status_code == 200
    event = ProviderEvent.objects.get()
    # Stored over a minute ago, so beat's re-drive picks it up while it is received.
    ProviderEvent.objects.update(received_at=timezone.now() - timedelta(minutes=5))
    return event, payment, wallet, merchant, body


def park(event: ProviderEvent) -> None:
    for _ in range(MAX_ATTEMPTS):
        provider_event_process_task(event.pk)
    event.refresh_from_db()
    assert event.status == ProviderEvent.Status.PARKED


def assert_untouched(payment: Payment, wallet) -> None:
    """Nothing of the late success applied: only the balance payment moved money."""
    payment.refresh_from_db()
    assert payment.status == Payment.Status.PENDING
    assert not Refund.objects.exists()
    assert balance(wallet) == 2500
    assert balance(merchant_account(currency="CNY")) == 2500
    assert balance(external_account(currency="CNY")) == -5000


def assert_refunded_once(payment: Payment, wallet) -> None:
    """The late success came in once and went back out once."""
    payment.refresh_from_db()
    assert payment.status == Payment.Status.REFUNDED
    assert Refund.objects.get(payment=payment).reason == "order_already_paid"
    assert JournalEntry.objects.filter(reference=f"provider:{payment.pk}").count() == 1
    assert JournalEntry.objects.filter(reference=f"refund:{payment.pk}").count() == 1
    assert balance(wallet) == 2500  # charged once, from the balance
    assert balance(merchant_account(currency="CNY")) == 2500
    assert balance(external_account(currency="CNY")) == -5000
    assert Order.objects.get(pk=payment.order_id).status == Order.Status.PAID
    report = ledger_report()
    assert report["ok"] and report["warnings"] == [], report


def check_ledger() -> tuple[dict, str]:
    out, err = StringIO(), StringIO()
    call_command("check_ledger", stdout=out, stderr=err)  # exit 0: no CommandError
    return json.loads(out.getvalue()), err.getvalue()


def parked_gauge(client) -> float:
    return gauge("payments_provider_events_parked", client)


def redrive_command(*args: str) -> tuple[list[dict], CommandError | None]:
    return command_lines("redrive_provider_events", *args)


def test_a_failing_callback_is_parked_after_max_attempts_and_kept(
    late_success, client, admin_client, django_capture_on_commit_callbacks
):
    event, payment, wallet, merchant, body = late_success
    assert parked_gauge(client) == 0
    for attempt in range(1, MAX_ATTEMPTS):
        assert provider_event_process_task(event.pk) == "received"
        event.refresh_from_db()
        assert (event.status, event.attempts) == ("received", attempt)
        assert "AccountNotActive account_not_active" in event.last_error
        assert inbox_stuck(older_than_seconds=60)[0] == [event.pk]
        assert redrive_inbox() == 1  # beat still re-drives it
    assert provider_event_process_task(event.pk) == "parked"
    event.refresh_from_db()
    assert (event.status, event.attempts) == ("parked", MAX_ATTEMPTS)
    assert event.parked_at is not None
    assert f"Account {merchant.pk} is frozen" in event.last_error

    # Parked: beat leaves it alone, more runs change nothing, nothing was applied.
    assert inbox_stuck(older_than_seconds=60)[0] == []
    assert redrive_inbox() == 0
    for _ in range(3):
        assert provider_event_process_task(event.pk) == "parked"
    event.refresh_from_db()
    assert event.attempts == MAX_ATTEMPTS
    assert_untouched(payment, wallet)
    # The provider delivers it again: acknowledged, kept parked, no task sent.
    with django_capture_on_commit_callbacks() as sent:
        assert post_callback(body).status_code == 200
    assert sent == []
    assert ProviderEvent.objects.get().status == "parked"

    # Visible: check_ledger warns (exit 0), /metrics counts it, the admin filters it.
    report, stderr = check_ledger()
    assert report["ok"] and report["violations"] == []
    (warning,) = report["warnings"]
    assert event.event_id in warning and "3 failed attempts" in warning
    assert "provider_events_parked" in report["warning_checks"]
    assert f"warning: {warning}" in stderr
    assert parked_gauge(client) == 1
    page = admin_client.get("/admin/payments/providerevent/?status__exact=parked")
    assert page.status_code == 200
    assert event.event_id in page.content.decode()
    assert "is frozen" in page.content.decode()
    others = admin_client.get("/admin/payments/providerevent/?status__exact=processed")
    assert event.event_id not in others.content.decode()


def test_the_operator_redrives_it_once_the_cause_is_fixed(late_success, client):
    event, payment, wallet, merchant, _ = late_success
    park(event)
    # Re-driven too early (still frozen): it fails again, with a fresh budget, and
    # beat takes it from there until it is parked again.
    lines, error = redrive_command()
    assert error is not None and "1 event(s) failed again" in str(error)
    assert [(line["redriven"], line["status"], line["attempts"]) for line in lines] == [
        (True, "received", 1)
    ]
    assert_untouched(payment, wallet)
    for _ in range(MAX_ATTEMPTS - 1):
        provider_event_process_task(event.pk)
    park(event)

    account_unfreeze(account_id=merchant.pk)
    lines, error = redrive_command("--event", event.event_id)
    assert error is None
    (line,) = lines
    assert line["event_id"] == event.event_id and line["redriven"] is True
    assert (line["status"], line["outcome"]) == ("processed", "payment refunded")
    assert_refunded_once(payment, wallet)
    assert parked_gauge(client) == 0

    # Pressed again: not parked any more, nothing happens.
    lines, error = redrive_command("--event", event.event_id)
    assert error is None
    assert [(line["redriven"], line["status"]) for line in lines] == [
        (False, "processed")
    ]
    assert redrive_command() == ([], None)  # nothing parked
    assert provider_event_redrive(event_id=event.pk)[1] is False
    provider_event_process(event_id=event.pk)  # a late task: a no-op
    assert_refunded_once(payment, wallet)


def test_the_admin_action_redrives_once(late_success, admin_client):
    event, payment, wallet, merchant, _ = late_success
    park(event)
    account_unfreeze(account_id=merchant.pk)
    url = "/admin/payments/providerevent/"
    form = {"action": "redrive", "_selected_action": [event.pk]}
    response = admin_client.post(url, form, follow=True)
    assert response.status_code == 200
    messages = [str(m) for m in response.context["messages"]]
    assert messages == ["Re-drive: 1 processed."], messages
    assert_refunded_once(payment, wallet)
    again = admin_client.post(url, form, follow=True)
    messages = [str(m) for m in again.context["messages"]]
    assert messages == ["Re-drive: 1 skipped (not parked)."], messages
    assert_refunded_once(payment, wallet)


def test_the_admin_action_says_when_an_event_fails_again(late_success, admin_client):
    event, payment, wallet, _, _ = late_success
    park(event)
    response = admin_client.post(
        "/admin/payments/providerevent/",
        {"action": "redrive", "_selected_action": [event.pk]},
        follow=True,
    )
    messages = [str(m) for m in response.context["messages"]]
    assert any("failed again" in m and "is frozen" in m for m in messages), messages
    assert_untouched(payment, wallet)


@pytest.mark.django_db(transaction=True)
def test_racing_redrives_process_it_once(on_postgres):
    user, _, wallet = customer("bob", balance=5000)
    order = place_order(user, amount=2500)
    payment = pending_provider_payment(order)
    payment_pay_with_balance(order_id=order.pk)
    merchant = merchant_account(currency="CNY")
    account_freeze(account_id=merchant.pk)
    assert post_callback(event_body(payment)).status_code == 200
    event = ProviderEvent.objects.get()
    park(event)
    account_unfreeze(account_id=merchant.pk)

    def redrive(i: int) -> bool:
        if i == 0:  # beat's task racing the operators: a no-op on a parked event
            provider_event_process(event_id=event.pk)
            return False
        return provider_event_redrive(event_id=event.pk)[1]

    results = run_in_threads(5, redrive)
    assert sorted(results) == [False, False, False, False, True], results
    event.refresh_from_db()
    assert event.status == "processed"
    assert_refunded_once(payment, wallet)
    connection.close()


def test_a_lost_database_connection_is_retried_not_counted(late_success, monkeypatch):
    event, *_ = late_success

    def connection_lost(*_args, **_kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(services, "_settle_its_charge", connection_lost)
    with pytest.raises(OperationalError), transaction.atomic():
        provider_event_process(event_id=event.pk)
    event.refresh_from_db()
    assert (event.status, event.attempts, event.last_error) == ("received", 0, "")
    assert issubclass(OperationalError, provider_event_process_task.autoretry_for)


@pytest.mark.parametrize("name", ["nope", "", "a\x00b", "x" * 500])
def test_the_command_refuses_unknown_events(late_success, name):
    event, payment, wallet, _, _ = late_success
    park(event)
    lines, error = redrive_command("--event", event.event_id, "--event", name)
    assert lines == [] and error is not None and "unknown provider event" in str(error)
    event.refresh_from_db()
    assert event.status == "parked"  # nothing done when any name is wrong
    assert_untouched(payment, wallet)
