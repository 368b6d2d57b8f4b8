"""Beat's re-drive of a pending provider payment whose answer cannot be applied is
parked for staff after PAYMENT_REDRIVE_MAX_ATTEMPTS refusals, never asked about
again every rotation, and applied once when staff re-drive it after fixing the cause.

The cause here: the provider collected the charge and refunded it since (`REFUNDED`),
and the refund cannot take the money out of the frozen merchant account. The
simulator answers over real HTTP; the re-drive's task runs on PostgreSQL.
"""

import contextlib
import socket
import time
from collections.abc import Iterator

import pytest
from django.core.management import CommandError
from django.db import connection, transaction
from django.utils import timezone

from ledger.invariants import ledger_report
from ledger.models import JournalEntry
from ledger.services import account_freeze, account_unfreeze, merchant_account
from orders.models import Order
from payments.models import Payment, Refund
from payments.provider_client import provider_charge_refund
from payments.services import (
    payment_apply_charge,
    payment_redrive_parked,
    payment_refund,
    payments_stuck,
)
from payments.tasks import payment_redrive_task, redrive_pending_payments
from tests.conftest import run_in_threads
from tests.helpers import (
    command_lines,
    customer,
    gauge,
    pending_provider_payment,
    place_order,
)
from tests.payments.test_beat import settle_at_provider
from tests.payments.test_redrive_outcomes import (
    ASKED,
    answer,
    assert_refunded_as_at_the_provider,
    stuck,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MAX_ATTEMPTS = 3
PAYMENTS = "/admin/payments/payment/"


@pytest.fixture
def refunded_on_frozen(provider, settings):
    """A provider payment pending past the timeout, whose charge the payer paid
    and the provider refunded since (its callback never came), while the
    merchant's account is frozen."""
    settings.PAYMENT_REDRIVE_MAX_ATTEMPTS = MAX_ATTEMPTS
    user, api, _ = customer("kim")
    payment = stuck(api, place_order(user, amount=ASKED))
    settle_at_provider(payment.pay_url, "confirm")
    provider_charge_refund(merchant_order_no=payment.order.merchant_order_no)
    merchant = merchant_account(currency="CNY")
    account_freeze(account_id=merchant.pk)
    return payment, merchant


def beat_rotation(payment: Payment) -> str:
    """What beat's `redrive_pending_payments` does for the payment: pick it, and
    run its task."""
    assert payments_stuck(older_than_seconds=60) == [payment.pk]
    return payment_redrive_task(payment.pk)


def assert_untouched(payment: Payment) -> None:
    payment.refresh_from_db()
    assert payment.status == Payment.Status.PENDING
    assert Order.objects.get(pk=payment.order_id).status == (
        Order.Status.PENDING_PAYMENT
    )
    assert not Refund.objects.exists()
    assert not JournalEntry.objects.filter(
        reference__in=[f"provider:{payment.pk}", f"refund:{payment.pk}"]
    ).exists()


def park(payment: Payment) -> None:
    for attempt in range(1, MAX_ATTEMPTS + 1):
        assert beat_rotation(payment) == "pending"
        payment.refresh_from_db()
        assert payment.redrive_attempts == attempt
    assert payment.redrive_parked_at is not None


def redrive_in_admin(admin_client, payment: Payment) -> list[str]:
    response = admin_client.post(
        PAYMENTS, {"action": "redrive", "_selected_action": [payment.pk]}, follow=True
    )
    assert response.status_code == 200
    return [str(m) for m in response.context["messages"]]


def test_a_refund_refused_by_a_frozen_merchant_is_parked(
    refunded_on_frozen, admin_client
):
    payment, merchant = refunded_on_frozen
    for attempt in range(1, MAX_ATTEMPTS):
        assert beat_rotation(payment) == "pending"
        payment.refresh_from_db()
        assert (payment.redrive_attempts, payment.redrive_parked_at) == (attempt, None)
        assert "AccountNotActive account_not_active" in payment.redrive_error
        assert_untouched(payment)
    assert beat_rotation(payment) == "pending"
    payment.refresh_from_db()
    assert payment.redrive_attempts == MAX_ATTEMPTS
    assert payment.redrive_parked_at is not None
    assert f"Account {merchant.pk} is frozen" in payment.redrive_error

    # Parked: beat no longer picks it, and its task sent late changes nothing more.
    assert payments_stuck(older_than_seconds=60) == []
    assert redrive_pending_payments() == 0
    assert payment_redrive_task(payment.pk) == "pending"
    payment.refresh_from_db()
    assert payment.redrive_attempts == MAX_ATTEMPTS
    assert_untouched(payment)

    # Visible to staff: the admin's filter and column, and check_ledger's warning.
    page = admin_client.get(f"{PAYMENTS}?redrive_parked_at__isnull=False")
    assert page.status_code == 200
    body = page.content.decode()
    assert f"Account {merchant.pk} is frozen" in body
    assert f"/admin/payments/payment/{payment.pk}/change/" in body
    unparked = admin_client.get(f"{PAYMENTS}?redrive_parked_at__isnull=True")
    assert f"/admin/payments/payment/{payment.pk}/change/" not in (
        unparked.content.decode()
    )
    report = ledger_report()
    assert report["ok"], report["violations"]
    assert report["warnings"] == [
        f"payment {payment.pk} (order {payment.order.merchant_order_no}) parked "
        f"after {MAX_ATTEMPTS} refused re-drives: {payment.redrive_error}"
    ]


def test_staff_redrive_it_once_the_account_is_unfrozen(
    refunded_on_frozen, admin_client
):
    payment, merchant = refunded_on_frozen
    park(payment)
    # Re-driven too early (still frozen): refused again, counted as a first
    # attempt, and beat takes it from there until it is parked again.
    messages = redrive_in_admin(admin_client, payment)
    assert any(f"Account {merchant.pk} is frozen" in m for m in messages), messages
    assert messages[-1] == "Re-drive: 1 failed again.", messages
    payment.refresh_from_db()
    assert (payment.redrive_attempts, payment.redrive_parked_at) == (1, None)
    assert_untouched(payment)
    for _ in range(MAX_ATTEMPTS - 1):
        assert beat_rotation(payment) == "pending"
    payment.refresh_from_db()
    assert payment.redrive_parked_at is not None

    account_unfreeze(account_id=merchant.pk)
    assert redrive_in_admin(admin_client, payment) == ["Re-drive: 1 re-driven."]
    assert_refunded_as_at_the_provider(payment)
    # Pressed again: not parked any more, nothing happens; beat has nothing to do.
    assert redrive_in_admin(admin_client, payment) == [
        "Re-drive: 1 skipped (not parked)."
    ]
    assert payments_stuck(older_than_seconds=60) == []
    assert_refunded_as_at_the_provider(payment)


def test_racing_staff_redrive_it_once(refunded_on_frozen):
    payment, merchant = refunded_on_frozen
    park(payment)
    account_unfreeze(account_id=merchant.pk)

    def redrive(i: int) -> bool:
        if i == 0:  # a late task of beat's: a no-op while parked, and either way
            # the services it applies the answer through move the money once
            payment_redrive_task(payment.pk)
            return False
        return payment_redrive_parked(payment_id=payment.pk)[1]

    results = run_in_threads(4, redrive)
    assert sorted(results) == [False, False, False, True], results
    assert_refunded_as_at_the_provider(payment)
    connection.close()


def parked_gauge() -> float:
    return gauge("payments_provider_payments_parked")


def redrive_command(*args: str) -> tuple[list[dict], CommandError | None]:
    return command_lines("redrive_parked_payments", *args)


def test_metrics_count_parked_payments(refunded_on_frozen):
    payment, merchant = refunded_on_frozen
    assert parked_gauge() == 0
    for _ in range(MAX_ATTEMPTS - 1):
        beat_rotation(payment)
    assert parked_gauge() == 0  # refused, not parked yet
    beat_rotation(payment)
    assert parked_gauge() == 1
    account_unfreeze(account_id=merchant.pk)
    payment_redrive_parked(payment_id=payment.pk)
    assert parked_gauge() == 0


def test_the_command_redrives_parked_payments_once_the_cause_is_fixed(
    refunded_on_frozen,
):
    payment, merchant = refunded_on_frozen
    park(payment)
    # Too early (still frozen): refused again, counted as a first attempt, exit 1.
    lines, error = redrive_command()
    assert error is not None and "1 payment(s) refused again" in str(error)
    (line,) = lines
    assert (line["payment"], line["redriven"], line["status"]) == (
        payment.pk,
        True,
        "pending",
    )
    assert (line["parked"], line["redrive_attempts"]) == (False, 1)
    assert f"Account {merchant.pk} is frozen" in line["redrive_error"]
    assert_untouched(payment)
    for _ in range(MAX_ATTEMPTS - 1):
        assert beat_rotation(payment) == "pending"
    payment.refresh_from_db()
    assert payment.redrive_parked_at is not None

    account_unfreeze(account_id=merchant.pk)
    lines, error = redrive_command("--payment", str(payment.pk))
    assert error is None
    assert lines == [
        {
            "payment": payment.pk,
            "redriven": True,
            "status": "refunded",
            "parked": False,
            "redrive_attempts": 0,  # the refusals are forgotten once it applied
            "redrive_error": "",
        }
    ]
    assert_refunded_as_at_the_provider(payment)
    # Run again: nothing parked, nothing named is parked; nothing moves.
    assert redrive_command() == ([], None)
    lines, error = redrive_command("--payment", str(payment.pk))
    assert error is None
    assert [(line["redriven"], line["status"]) for line in lines] == [
        (False, "refunded")
    ]
    assert_refunded_as_at_the_provider(payment)


def test_the_command_refuses_an_unknown_payment_and_moves_nothing(
    refunded_on_frozen,
):
    payment, merchant = refunded_on_frozen
    park(payment)
    account_unfreeze(account_id=merchant.pk)
    known = str(payment.pk)
    for name in ["999999999", "0", "-1", "abc", "", "1.0", "\uff11", "9" * 30, "1\x00"]:
        lines, error = redrive_command("--payment", known, "--payment", name)
        assert error is not None and "unknown payment(s)" in str(error), name
        assert repr(name) in str(error)
        assert lines == []
    payment.refresh_from_db()
    assert payment.redrive_parked_at is not None  # the known one was not re-driven
    assert_untouched(payment)


def test_racing_commands_redrive_it_once(refunded_on_frozen):
    payment, merchant = refunded_on_frozen
    park(payment)
    account_unfreeze(account_id=merchant.pk)

    def run(i: int) -> list[dict]:
        named = ["--payment", str(payment.pk)] if i % 2 else []  # or every parked one
        lines, error = redrive_command(*named)
        assert error is None
        return lines

    results = run_in_threads(4, run)
    assert not [r for r in results if isinstance(r, Exception)], results
    redriven = [line["redriven"] for lines in results for line in lines]
    assert redriven.count(True) == 1, results
    assert_refunded_as_at_the_provider(payment)
    assert parked_gauge() == 0


def test_a_redrive_that_applies_forgets_the_refusals_before_it(refunded_on_frozen):
    payment, merchant = refunded_on_frozen
    for _ in range(MAX_ATTEMPTS - 1):
        assert beat_rotation(payment) == "pending"
    payment.refresh_from_db()
    assert payment.redrive_attempts == MAX_ATTEMPTS - 1 and payment.redrive_error
    account_unfreeze(account_id=merchant.pk)
    assert beat_rotation(payment) == "refunded"
    payment.refresh_from_db()
    assert (payment.redrive_attempts, payment.redrive_error) == (0, "")
    assert payment.redrive_parked_at is None
    assert_refunded_as_at_the_provider(payment)


def parked_too(payment: Payment, username: str) -> Payment:
    """Another provider payment, stuck and parked as `payment` is."""
    user, api, _ = customer(username)
    other = stuck(api, place_order(user, amount=ASKED))
    Payment.objects.filter(pk=other.pk).update(
        redrive_parked_at=payment.redrive_parked_at,
        redrive_attempts=MAX_ATTEMPTS,
        redrive_error=payment.redrive_error,
    )
    return other


@contextlib.contextmanager
def silent_provider(settings) -> Iterator[None]:
    """The provider at an address that takes connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]
        settings.PAYMENT_PROVIDER_URL = f"http://127.0.0.1:{port}/provider"
        settings.PAYMENT_PROVIDER_TIMEOUT_SECONDS = 1.0
        yield


def test_a_provider_that_does_not_answer_stops_the_press(
    refunded_on_frozen, admin_client, settings
):
    """Staff re-drive three parked payments while the provider does not answer:
    no server error, and no wait on the provider for each of them (a press that
    waited for every one would outlast the web server's timeout, cut short with
    nothing said). The first, unparked, is beat's again; the rest stay parked, and
    the page says so."""
    payment, merchant = refunded_on_frozen
    park(payment)
    others = [parked_too(payment, name) for name in ("lou", "max")]
    account_unfreeze(account_id=merchant.pk)

    selection = [payment.pk, *(other.pk for other in others)]
    with silent_provider(settings):
        started = time.monotonic()
        response = admin_client.post(
            PAYMENTS, {"action": "redrive", "_selected_action": selection}, follow=True
        )
        assert time.monotonic() - started < 2.5  # one wait on the provider, not 3
    assert response.status_code == 200
    messages = [str(m) for m in response.context["messages"]]
    assert messages[0].startswith(f"Payment {payment.pk}: ")
    assert "did not answer" in messages[0] and "Beat re-drives it" in messages[0]
    assert messages[-1] == (
        "Re-drive: 1 failed again, 2 not tried (still parked: re-drive them again)."
    ), messages
    assert_untouched(payment)
    payment.refresh_from_db()
    assert (payment.redrive_attempts, payment.redrive_parked_at) == (0, None)
    assert payments_stuck(older_than_seconds=60) == [payment.pk]
    for other in others:
        other.refresh_from_db()
        assert other.redrive_parked_at is not None


def test_a_press_starts_re_drives_for_a_while_only(
    refunded_on_frozen, admin_client, monkeypatch
):
    """Past its time a press starts no more re-drives: the rest stay parked, for
    the next press. (At least one is re-driven, however slow.)"""
    from payments.admin import PaymentAdmin

    payment, merchant = refunded_on_frozen
    park(payment)
    other = parked_too(payment, "ned")
    account_unfreeze(account_id=merchant.pk)
    monkeypatch.setattr(PaymentAdmin, "redrive_seconds", 0.0)

    selection = [payment.pk, other.pk]
    response = admin_client.post(
        PAYMENTS, {"action": "redrive", "_selected_action": selection}, follow=True
    )
    assert [str(m) for m in response.context["messages"]] == [
        "Re-drive: 1 re-driven, 1 not tried (still parked: re-drive it again)."
    ]
    payment.refresh_from_db()
    assert payment.status == Payment.Status.REFUNDED
    assert Refund.objects.get(payment=payment).reason == "refunded_at_provider"
    other.refresh_from_db()
    assert other.status == Payment.Status.PENDING
    assert other.redrive_parked_at is not None


def test_a_parked_payment_settled_another_way_is_no_warning():
    """A payment parked while its refund was refused, refunded since another way
    (the customer's own refund once the account is active again): nothing is left
    for staff, so check_ledger names it no more."""
    user, _, _ = customer("oda")
    payment = pending_provider_payment(place_order(user, amount=ASKED))
    payment_apply_charge(payment_id=payment.pk, charge=answer(payment, "SUCCESS"))
    Payment.objects.filter(pk=payment.pk).update(
        redrive_parked_at=timezone.now(),
        redrive_attempts=MAX_ATTEMPTS,
        redrive_error="AccountNotActive account_not_active: Account 1 is frozen.",
    )
    assert ledger_report()["warnings"] != []  # parked, and still succeeded
    with transaction.atomic():
        payment_refund(payment_id=payment.pk)
    report = ledger_report()
    assert report["ok"], report["violations"]
    assert not any("parked" in w for w in report["warnings"]), report["warnings"]


def test_the_command_stops_at_a_provider_that_does_not_answer(
    refunded_on_frozen, settings
):
    """No traceback: the payment the provider did not answer for is beat's again
    (unparked), the rest stay parked, and the command says so and exits 1."""
    payment, merchant = refunded_on_frozen
    park(payment)
    other = parked_too(payment, "lou")
    account_unfreeze(account_id=merchant.pk)
    with silent_provider(settings):
        lines, error = redrive_command()
    assert lines == [
        {"payment": payment.pk, "redriven": True, "error": "provider_unavailable"}
    ]
    assert str(error) == "1 payment(s) refused again; 1 not tried, still parked"
    assert_untouched(payment)
    assert payments_stuck(older_than_seconds=60) == [payment.pk]
    other.refresh_from_db()
    assert other.redrive_parked_at is not None
