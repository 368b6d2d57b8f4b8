"""Holds: authorize now, capture later (manual capture of balance payments).

Real PostgreSQL, real threads for the races; the money is checked to the unit: the
wallet's `balance`, `held` and `available`, the merchant's balance, and every
invariant `check_ledger` proves.
"""

import html
import json
import re
from datetime import timedelta
from io import StringIO

import pytest
from django.db import connection, transaction
from django.utils import timezone

from ledger.exceptions import InsufficientFunds
from ledger.invariants import ledger_report
from ledger.models import Account, Hold, JournalEntry
from ledger.services import merchant_account
from orders.models import Order
from orders.services import order_cancel, order_cancel_expired
from payments.exceptions import PaymentNotCapturable, PaymentNotVoidable
from payments.models import Payment, Shipment
from payments.services import (
    payment_authorize_with_balance,
    payment_capture,
    payment_expire,
    payment_pay_with_balance,
    payment_void,
)
from payments.tasks import expire_holds
from tests.conftest import run_in_threads
from tests.helpers import (
    assert_ledger_ok,
    assert_problem,
    customer,
    new_key,
    place_order,
)

pytestmark = pytest.mark.django_db

DAY = 86400


def pay(client, order, body=None, key=None):
    return client.post(
        f"/api/v1/orders/{order.merchant_order_no}/pay",
        body if body is not None else {"method": "balance", "capture": "manual"},
        format="json",
        headers={"Idempotency-Key": key or new_key()},
    )


def act(client, payment_id: int, action: str, body=None, key=None):
    return client.post(
        f"/api/v1/payments/{payment_id}/{action}",
        body if body is not None else {},
        format="json",
        headers={"Idempotency-Key": key or new_key()},
    )


def money(wallet: Account) -> tuple[int, int, int]:
    """(balance, held, available) of the wallet, read again."""
    wallet.refresh_from_db()
    return wallet.balance, wallet.held, wallet.available


def merchant_balance() -> int:
    return merchant_account(currency="CNY").balance


def order_status(order: Order) -> str:
    order.refresh_from_db()
    return order.status_name


def expire_now(payment_id: int) -> None:
    """Put the payment's hold past its expiry (as time passing would)."""
    past = timezone.now() - timedelta(seconds=1)
    Hold.objects.filter(payment__pk=payment_id).update(expires_at=past)


def authorize(user, amount: int = 1000) -> tuple[Order, Payment]:
    order = place_order(user, amount=amount)
    with transaction.atomic():
        payment = payment_authorize_with_balance(order_id=order.pk, hold_seconds=DAY)
    return order, payment


# Authorize ----------------------------------------------------------------------


def test_authorize_holds_the_money_without_moving_it():
    user, client, wallet = customer("alice", balance=5000)
    order = place_order(user, amount=1200)
    before = timezone.now()
    response = pay(client, order)
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["status"], body["amount"], body["authorized_amount"]) == (
        "authorized",
        1200,
        1200,
    )
    expires = timezone.datetime.fromisoformat(body["expires_at"])
    assert timedelta(seconds=604790) < expires - before < timedelta(seconds=604810)
    assert money(wallet) == (5000, 1200, 3800)
    assert order_status(order) == "authorized"
    assert not JournalEntry.objects.filter(kind="payment").exists()
    me = client.get("/api/v1/accounts/me").json()
    assert (me["balance"], me["held"], me["available"]) == (5000, 1200, 3800)
    shown = client.get(f"/api/v1/orders/{order.merchant_order_no}").json()
    assert shown["status"] == "authorized"
    assert shown["payments"][0]["status"] == "authorized"
    assert client.get(f"/api/v1/payments/{body['id']}").json() == body
    assert_ledger_ok()


def test_authorize_takes_hold_seconds():
    user, client, _ = customer("alice", balance=5000)
    before = timezone.now()
    body = pay(
        client,
        place_order(user),
        {"method": "balance", "capture": "manual", "hold_seconds": 60},
    ).json()
    expires = timezone.datetime.fromisoformat(body["expires_at"])
    assert timedelta(seconds=55) < expires - before < timedelta(seconds=65)


def test_an_automatic_payment_shows_no_authorization():
    user, client, wallet = customer("alice", balance=5000)
    body = pay(client, place_order(user), {"method": "balance"}).json()
    assert body["status"] == "succeeded"
    assert (body["authorized_amount"], body["expires_at"]) == (None, None)
    body = pay(
        client, place_order(user), {"method": "balance", "capture": "automatic"}
    ).json()
    assert body["status"] == "succeeded"
    assert money(wallet) == (3000, 0, 3000)


def test_authorize_needs_available_money():
    user, client, wallet = customer("alice", balance=1500)
    pay(client, place_order(user, amount=1000))
    refused = pay(client, place_order(user, amount=600))
    assert_problem(refused, 422, "insufficient_funds")
    assert money(wallet) == (1500, 1000, 500)
    assert Payment.objects.count() == 1  # the refused one rolled back entirely
    assert Hold.objects.count() == 1
    assert_ledger_ok()


def test_a_debit_is_refused_when_available_is_short_though_balance_is_not():
    user, client, wallet = customer("alice", balance=1500)
    pay(client, place_order(user, amount=1000))
    order = place_order(user, amount=1000)  # balance 1500 >= 1000, available 500
    refused = pay(client, order, {"method": "balance"})
    assert_problem(refused, 422, "insufficient_funds")
    assert refused.json()["available"] == 500
    assert money(wallet) == (1500, 1000, 500)
    assert order_status(order) == "pending_payment"
    with pytest.raises(InsufficientFunds), transaction.atomic():
        payment_pay_with_balance(order_id=order.pk)
    assert_ledger_ok()


def test_authorize_retry_with_the_same_key_replays():
    user, client, wallet = customer("alice", balance=5000)
    order = place_order(user, amount=700)
    key = new_key()
    first = pay(client, order, key=key)
    again = pay(client, order, key=key)
    assert again.status_code == 201 and again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert money(wallet) == (5000, 700, 4300)
    assert Hold.objects.count() == 1
    other_key = pay(client, order)
    assert_problem(other_key, 409, "order_not_payable")
    assert_problem(pay(client, order, {"method": "balance"}), 409, "order_not_payable")
    assert money(wallet) == (5000, 700, 4300)


@pytest.mark.parametrize(
    "body",
    [
        {"method": "balance", "capture": "later"},
        {"method": "balance", "capture": None},
        {"method": "balance", "capture": "manual", "hold_seconds": 59},
        {"method": "balance", "capture": "manual", "hold_seconds": 2592001},
        {"method": "balance", "capture": "manual", "hold_seconds": "600"},
        {"method": "balance", "capture": "manual", "hold_seconds": 600.0},
        {"method": "balance", "capture": "manual", "hold_seconds": True},
        {"method": "balance", "hold_seconds": 600},
        {"method": "provider", "capture": "manual"},
        {"method": "balance", "capture": "manual", "amount": 5},
    ],
)
def test_authorize_bad_input_is_400_and_writes_nothing(body):
    user, client, wallet = customer("alice", balance=5000)
    order = place_order(user)
    assert_problem(pay(client, order, body), 400, "validation_error")
    assert money(wallet) == (5000, 0, 5000)
    assert not Payment.objects.exists() and not Hold.objects.exists()
    assert order_status(order) == "pending_payment"


@pytest.mark.django_db(transaction=True)
def test_racing_authorizations_never_hold_more_than_available(on_postgres):
    user, _, wallet = customer("alice", balance=3000)
    orders = [place_order(user, amount=1000) for _ in range(6)]
    results = run_in_threads(
        6,
        lambda i: payment_authorize_with_balance(
            order_id=orders[i].pk, hold_seconds=60
        ),
    )
    assert sum(isinstance(r, Payment) for r in results) == 3, results
    assert sum(isinstance(r, InsufficientFunds) for r in results) == 3, results
    assert money(wallet) == (3000, 3000, 0)
    assert_ledger_ok()


# Capture ------------------------------------------------------------------------


def test_capture_in_full_debits_once_and_releases_the_hold():
    user, client, wallet = customer("alice", balance=5000)
    order = place_order(user, amount=1200)
    authorized = pay(client, order).json()
    response = act(client, authorized["id"], "capture")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["status"], body["amount"], body["authorized_amount"]) == (
        "succeeded",
        1200,
        1200,
    )
    assert body["succeeded_at"]
    assert money(wallet) == (3800, 0, 3800)
    assert merchant_balance() == 1200
    assert order_status(order) == "paid"
    entry = JournalEntry.objects.get(kind="payment")
    assert entry.reference == f"payment:{order.pk}"
    assert Hold.objects.get().status == Hold.Status.CAPTURED
    assert Shipment.objects.get().order_id == order.pk  # captured: it ships
    assert_ledger_ok()


def test_partial_capture_debits_what_was_captured_and_releases_all():
    user, client, wallet = customer("alice", balance=5000)
    order = place_order(user, amount=1200)
    authorized = pay(client, order).json()
    body = act(client, authorized["id"], "capture", {"amount": 500}).json()
    assert (body["status"], body["amount"], body["authorized_amount"]) == (
        "succeeded",
        500,
        1200,
    )
    assert money(wallet) == (4500, 0, 4500)
    assert merchant_balance() == 500
    assert order_status(order) == "paid"
    assert_ledger_ok()


def test_capture_sees_the_money_its_own_hold_reserved():
    user, client, wallet = customer("alice", balance=1000)
    authorized = pay(client, place_order(user, amount=1000)).json()
    assert money(wallet) == (1000, 1000, 0)
    assert act(client, authorized["id"], "capture").status_code == 200
    assert money(wallet) == (0, 0, 0)
    assert_ledger_ok()


def test_a_captured_payment_refunds_like_any_other():
    user, client, wallet = customer("alice", balance=5000)
    order = place_order(user, amount=1200)
    authorized = pay(client, order).json()
    act(client, authorized["id"], "capture", {"amount": 800})
    refund = act(client, authorized["id"], "refund")
    assert refund.status_code == 201, refund.content
    assert refund.json()["amount"] == 800
    assert money(wallet) == (5000, 0, 5000)
    assert merchant_balance() == 0
    assert order_status(order) == "refunded"
    assert_problem(
        act(client, authorized["id"], "capture"), 409, "payment_not_capturable"
    )
    assert_ledger_ok()


def test_capture_retry_with_the_same_key_replays_and_another_key_is_refused():
    user, client, wallet = customer("alice", balance=5000)
    authorized = pay(client, place_order(user, amount=1000)).json()
    key = new_key()
    first = act(client, authorized["id"], "capture", {"amount": 400}, key=key)
    again = act(client, authorized["id"], "capture", {"amount": 400}, key=key)
    assert again.status_code == 200 and again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    second = act(client, authorized["id"], "capture", {"amount": 400})
    assert_problem(second, 409, "payment_not_capturable")
    assert money(wallet) == (4600, 0, 4600)
    assert JournalEntry.objects.filter(kind="payment").count() == 1


@pytest.mark.parametrize(
    "body",
    [
        {"amount": 0},
        {"amount": -5},
        {"amount": "500"},
        {"amount": 5.5},
        {"amount": True},
        {"amount": None},
        {"amount": 2**63},  # past 64 bits: no amount at all (README's input table)
        {"amount": 500, "currency": "CNY"},
        [],
    ],
)
def test_capture_bad_input_is_400_and_changes_nothing(body):
    user, client, wallet = customer("alice", balance=5000)
    authorized = pay(client, place_order(user, amount=1000)).json()
    assert_problem(
        act(client, authorized["id"], "capture", body), 400, "validation_error"
    )
    assert money(wallet) == (5000, 1000, 4000)
    assert Payment.objects.get().status == "authorized"


@pytest.mark.parametrize("amount", [1001, 10**15 + 1, 2**63 - 1])
def test_capture_above_the_authorization_is_422_and_changes_nothing(amount):
    # The contract: "An amount above the authorization: 422". One above the
    # largest amount an order may have was a 400 for its form: still above it.
    user, client, wallet = customer("alice", balance=5000)
    order = place_order(user, amount=1000)
    authorized = pay(client, order).json()
    refused = act(client, authorized["id"], "capture", {"amount": amount})
    assert_problem(refused, 422, "capture_exceeds_authorization")
    assert money(wallet) == (5000, 1000, 4000)
    assert order_status(order) == "authorized"
    assert act(client, authorized["id"], "capture", {"amount": 1000}).status_code == 200


def test_only_an_authorized_payment_is_captured_or_voided():
    user, client, _ = customer("alice", balance=5000)
    paid = pay(client, place_order(user), {"method": "balance"}).json()
    assert_problem(act(client, paid["id"], "capture"), 409, "payment_not_capturable")
    assert_problem(act(client, paid["id"], "void"), 409, "payment_not_voidable")
    _, stranger, _ = customer("mallory", balance=5000)
    authorized = pay(client, place_order(user)).json()
    assert_problem(act(stranger, authorized["id"], "capture"), 404, "not_found")
    assert_problem(act(stranger, authorized["id"], "void"), 404, "not_found")
    assert_problem(act(client, 10**12, "capture"), 404, "not_found")


def test_a_hold_past_its_expiry_is_not_captured_even_before_the_task_ran():
    user, client, wallet = customer("alice", balance=5000)
    authorized = pay(client, place_order(user, amount=1000)).json()
    expire_now(authorized["id"])
    assert_problem(
        act(client, authorized["id"], "capture"), 409, "payment_not_capturable"
    )
    assert money(wallet) == (5000, 1000, 4000)


@pytest.mark.django_db(transaction=True)
def test_thirty_captures_under_thirty_keys_debit_once(on_postgres):
    user, client, wallet = customer("alice", balance=5000)
    order = place_order(user, amount=1000)
    authorized = pay(client, order).json()
    statuses = run_in_threads(
        30, lambda i: act(client, authorized["id"], "capture").status_code
    )
    assert sorted(statuses) == [200] + [409] * 29, statuses
    assert money(wallet) == (4000, 0, 4000)
    assert merchant_balance() == 1000
    assert JournalEntry.objects.filter(kind="payment").count() == 1
    assert order_status(order) == "paid"
    assert Shipment.objects.filter(order=order).count() == 1
    assert_ledger_ok()


def test_every_change_of_what_the_account_shows_bumps_its_version():
    """`accounts/me` shows `held` and `available`: placing a hold, and releasing it
    by a void, a capture or the expiry, changes them, and so the version, once
    each; a replay or a refusal changes neither."""
    user, client, _ = customer("alice", balance=5000)

    def shown() -> tuple[int, int]:
        me = client.get("/api/v1/accounts/me").json()
        return me["available"], me["version"]

    available, version = shown()
    order = place_order(user, amount=1200)
    key = new_key()
    authorized = pay(client, order, key=key).json()
    assert shown() == (available - 1200, version + 1)
    pay(client, order, key=key)  # a replay holds nothing more
    assert shown() == (available - 1200, version + 1)
    assert act(client, authorized["id"], "void").status_code == 200
    assert shown() == (available, version + 2)
    too_much = place_order(user, amount=5001)
    assert_problem(pay(client, too_much), 422, "insufficient_funds")
    assert shown() == (available, version + 2)

    captured = pay(client, place_order(user, amount=1000)).json()
    assert shown() == (available - 1000, version + 3)
    assert act(client, captured["id"], "capture", {"amount": 400}).status_code == 200
    assert shown() == (available - 400, version + 4)  # debit and release: one change

    _, payment = authorize(user, 500)
    assert shown() == (available - 900, version + 5)
    expire_now(payment.pk)
    assert expire_holds() == 1
    assert shown() == (available - 400, version + 6)
    assert_ledger_ok()


# Void ---------------------------------------------------------------------------


def test_void_releases_the_hold_and_cancels_the_order():
    user, client, wallet = customer("alice", balance=5000)
    order = place_order(user, amount=1200)
    authorized = pay(client, order).json()
    key = new_key()
    response = act(client, authorized["id"], "void", key=key)
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "voided"
    assert money(wallet) == (5000, 0, 5000)
    assert order_status(order) == "cancelled"
    assert Hold.objects.get().status == Hold.Status.VOIDED
    again = act(client, authorized["id"], "void", key=key)
    assert again.json() == response.json() and again["Idempotent-Replayed"] == "true"
    assert_problem(act(client, authorized["id"], "void"), 409, "payment_not_voidable")
    assert_problem(
        act(client, authorized["id"], "capture"), 409, "payment_not_capturable"
    )
    assert_problem(
        act(client, authorized["id"], "void", {"x": 1}), 400, "validation_error"
    )
    assert money(wallet) == (5000, 0, 5000)
    assert_ledger_ok()


def test_void_bad_input_is_400_and_changes_nothing():
    user, client, wallet = customer("alice", balance=5000)
    authorized = pay(client, place_order(user, amount=1000)).json()
    for body in ({"amount": 5}, [], {"reason": "x"}):
        assert_problem(
            act(client, authorized["id"], "void", body), 400, "validation_error"
        )
    assert money(wallet) == (5000, 1000, 4000)


def test_cancelling_an_authorized_order_voids_its_hold_first():
    user, client, wallet = customer("alice", balance=5000)
    order = place_order(user, amount=1200)
    authorized = pay(client, order).json()
    cancelled = client.post(
        f"/api/v1/orders/{order.merchant_order_no}/cancel",
        {},
        format="json",
        headers={"Idempotency-Key": new_key()},
    )
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert money(wallet) == (5000, 0, 5000)
    assert Payment.objects.get(pk=authorized["id"]).status == "voided"
    assert Hold.objects.get().status == Hold.Status.VOIDED
    assert_ledger_ok()


def test_cancelling_an_authorized_order_on_the_web_voids_its_hold(client):
    user, api, wallet = customer("alice", balance=5000)
    order = place_order(user, amount=1200)
    pay(api, order)
    client.force_login(user)
    response = client.post(f"/orders/{order.merchant_order_no}/cancel")
    assert response.status_code == 303
    assert order_status(order) == "cancelled"
    assert money(wallet) == (5000, 0, 5000)
    assert Payment.objects.get().status == "voided"
    assert_ledger_ok()


# Expiry -------------------------------------------------------------------------


def test_the_task_expires_holds_past_their_expiry_only():
    user, _, wallet = customer("alice", balance=5000)
    order, payment = authorize(user, 1000)
    kept, _ = authorize(user, 500)
    assert expire_holds() == 0
    expire_now(payment.pk)
    assert expire_holds() == 1
    payment.refresh_from_db()
    assert payment.status == "expired"
    assert Hold.objects.get(pk=payment.hold_id).status == Hold.Status.EXPIRED
    assert order_status(order) == "cancelled"
    assert order_status(kept) == "authorized"
    assert money(wallet) == (5000, 500, 4500)
    assert expire_holds() == 0  # a second beat finds nothing
    with transaction.atomic():
        assert payment_expire(payment_id=payment.pk) == (payment, False)
    assert money(wallet) == (5000, 500, 4500)
    assert_ledger_ok()


def test_expiry_is_on_beat_every_10_seconds(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["payments-expire-holds"]
    assert entry["task"] == "payments.tasks.expire_holds"
    assert entry["schedule"] <= 10  # an expired hold counts in `held` until then
    assert settings.HOLD_TTL_SECONDS == 604800


def test_the_expiry_of_unpaid_orders_never_touches_an_authorized_one():
    user, _, wallet = customer("alice", balance=5000)
    order, _ = authorize(user, 1000)
    Order.objects.filter(pk=order.pk).update(
        created_at=timezone.now() - timedelta(days=30)
    )
    assert order_cancel_expired(older_than_seconds=60) == 0
    assert order_status(order) == "authorized"
    assert money(wallet) == (5000, 1000, 4000)  # it expires with its hold instead


@pytest.mark.django_db(transaction=True)
def test_two_beats_expiring_at_once_release_once(on_postgres):
    user, _, wallet = customer("alice", balance=5000)
    payments = [authorize(user, 500)[1] for _ in range(4)]
    for payment in payments:
        expire_now(payment.pk)
    results = run_in_threads(4, lambda i: expire_holds())
    assert sum(results) == 4, results
    assert money(wallet) == (5000, 0, 5000)
    assert set(Payment.objects.values_list("status", flat=True)) == {"expired"}
    assert_ledger_ok()


# Races: exactly one of capture, void and expiry wins ----------------------------


def _race(payment_id: int, i: int):
    def capture():
        return payment_capture(payment_id=payment_id, amount=600)

    def void():
        return payment_void(payment_id=payment_id)

    def expire():
        payment, moved = payment_expire(payment_id=payment_id)
        return payment if moved else PaymentNotCapturable("expired already")

    return (capture, void, expire)[i % 3]()


def _check_one_winner(wallet, order, payment_id: int, balance_before: int) -> str:
    payment = Payment.objects.select_related("hold").get(pk=payment_id)
    hold = payment.hold
    assert hold is not None
    assert payment.status != "authorized" or hold.status == "active"
    balance, held, _ = money(wallet)
    if payment.status == "succeeded":
        assert hold.status == "captured"
        assert (balance, order_status(order)) == (balance_before - 600, "paid")
        assert JournalEntry.objects.filter(reference=f"payment:{order.pk}").exists()
    else:
        assert balance == balance_before
        assert not JournalEntry.objects.filter(reference=f"payment:{order.pk}").exists()
        if payment.status in ("voided", "expired"):
            assert hold.status == payment.status
            assert order_status(order) == "cancelled"
    assert held == sum(
        Hold.objects.filter(account=wallet, status="active").values_list(
            "amount", flat=True
        )
    )
    assert_ledger_ok()
    return payment.status


@pytest.mark.django_db(transaction=True)
def test_capture_racing_void_racing_expiry_one_wins(on_postgres):
    user, _, wallet = customer("alice", balance=100_000)
    outcomes = set()
    for round_ in range(8):
        order, payment = authorize(user, 1000)
        # Around now: the expiry may find the hold past it or not, the capture may
        # find it still valid or not; whatever the timing, one of them wins.
        at = timezone.now() + timedelta(milliseconds=(round_ % 4) * 40 - 40)
        Hold.objects.filter(pk=payment.hold_id).update(expires_at=at)
        before = money(wallet)[0]
        results = run_in_threads(9, lambda i, pk=payment.pk: _race(pk, i))
        winner = _check_one_winner(wallet, order, payment.pk, before)
        losers = (PaymentNotCapturable, PaymentNotVoidable)
        winners = [r for r in results if isinstance(r, Payment)]
        assert all(isinstance(r, (*losers, Payment)) for r in results), results
        if winner == "authorized":  # all three came too early or too late
            assert not winners, results
        else:
            assert len(winners) == 1, results
            outcomes.add(winner)
    assert outcomes, "no round had a winner"


@pytest.mark.django_db(transaction=True)
def test_capture_racing_void_one_wins(on_postgres):
    user, _, wallet = customer("alice", balance=100_000)
    for _ in range(4):
        order, payment = authorize(user, 1000)
        before = money(wallet)[0]
        results = run_in_threads(10, lambda i, pk=payment.pk: _race(pk, i % 2))
        winners = [r for r in results if isinstance(r, Payment)]
        assert len(winners) == 1, results
        assert _check_one_winner(wallet, order, payment.pk, before) in (
            "succeeded",
            "voided",
        )


@pytest.mark.django_db(transaction=True)
def test_void_racing_expiry_one_wins(on_postgres):
    user, _, wallet = customer("alice", balance=100_000)
    for _ in range(4):
        order, payment = authorize(user, 1000)
        expire_now(payment.pk)
        results = run_in_threads(6, lambda i, pk=payment.pk: _race(pk, 1 + i % 2))
        winners = [r for r in results if isinstance(r, Payment)]
        assert len(winners) == 1, results
        status = _check_one_winner(wallet, order, payment.pk, money(wallet)[0])
        assert status in ("voided", "expired")


@pytest.mark.django_db(transaction=True)
def test_cancel_racing_capture_one_wins(on_postgres):
    user, _, wallet = customer("alice", balance=100_000)
    for _ in range(4):
        order, payment = authorize(user, 1000)
        before = money(wallet)[0]

        def work(i: int, order_id=order.pk, pk=payment.pk):
            if i % 2:
                return order_cancel(order_id=order_id)
            return payment_capture(payment_id=pk, amount=600)

        run_in_threads(6, work)
        assert _check_one_winner(wallet, order, payment.pk, before) in (
            "succeeded",
            "voided",
        )


# check_ledger -------------------------------------------------------------------


def test_check_ledger_catches_held_that_does_not_match_the_holds():
    user, _, wallet = customer("alice", balance=5000)
    authorize(user, 1000)
    assert_ledger_ok()
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE ledger_account SET held = held + 7 WHERE id = %s", [wallet.pk]
        )
    report = ledger_report()
    assert not report["ok"]
    assert report["violations"] == [
        f"account {wallet.pk} held 1007 != sum of its active holds 1000"
    ]
    assert {"held_matches_active_holds", "available_not_negative"} <= set(
        report["checks"]
    )


def test_check_ledger_catches_a_payment_out_of_step_with_its_hold():
    user, _, _ = customer("alice", balance=5000)
    _, payment = authorize(user, 1000)
    Payment.objects.filter(pk=payment.pk).update(status="voided")
    violations = ledger_report()["violations"]
    assert violations == [f"payment {payment.pk} is voided but its hold is active"]


def test_the_web_shows_an_authorized_order_and_what_the_wallet_holds(client):
    user, api, _ = customer("alice", balance=5000)
    order = place_order(user, amount=1200)
    pay(api, order)
    client.force_login(user)
    page = client.get(f"/orders/{order.merchant_order_no}").content.decode()
    assert 'data-status="authorized"' in page and 'id="held-note"' in page
    assert f"/orders/{order.merchant_order_no}/cancel" in page
    assert 'id="pay"' not in page
    account = client.get("/account").content.decode()
    assert "held by authorized payments" in account
    zh = client.get(
        f"/orders/{order.merchant_order_no}", headers={"Accept-Language": "zh-hans"}
    ).content.decode()
    assert "已授权" in zh and "取消订单即可释放" in zh


# Admin and check_ledger ---------------------------------------------------------


def _admin_action(admin_client, action: str, *pks: int) -> list[str]:
    response = admin_client.post(
        "/admin/payments/payment/",
        {"action": action, "_selected_action": list(pks)},
        follow=True,
    )
    assert response.status_code == 200
    return [str(m) for m in response.context["messages"]]


def test_the_admin_captures_and_voids_once_per_click(admin_client):
    user, _, wallet = customer("alice", balance=5000)
    captured_order, to_capture = authorize(user, 1000)
    voided_order, to_void = authorize(user, 700)
    assert _admin_action(admin_client, "capture", to_capture.pk) == [
        "Captured: 1, skipped: 0."
    ]
    messages = _admin_action(admin_client, "capture", to_capture.pk)  # a second click
    assert messages[-1] == "Captured: 0, skipped: 1."
    assert "Only an authorized payment whose hold has not expired" in messages[0]
    assert _admin_action(admin_client, "void", to_void.pk, to_capture.pk)[-1] == (
        "Voided: 1, skipped: 1."
    )
    admin_client.defaults["HTTP_ACCEPT_LANGUAGE"] = "zh-hans"
    messages = _admin_action(admin_client, "void", to_void.pk)
    assert messages == [  # (full-width punctuation, as Chinese writes it)
        f"支付 {to_void.pk}：只有已授权的付款才能撤销，未做任何操作。",  # noqa: RUF001
        "已撤销：0，已跳过：1。",  # noqa: RUF001
    ], messages
    assert money(wallet) == (4000, 0, 4000)
    assert merchant_balance() == 1000
    assert (order_status(captured_order), order_status(voided_order)) == (
        "paid",
        "cancelled",
    )
    assert JournalEntry.objects.filter(kind="payment").count() == 1
    assert_ledger_ok()


def test_the_admin_cancelling_an_authorized_order_voids_its_hold(admin_client):
    user, _, wallet = customer("alice", balance=5000)
    order, payment = authorize(user, 1000)
    admin_client.post(
        "/admin/orders/order/", {"action": "cancel", "_selected_action": [order.pk]}
    )
    assert order_status(order) == "cancelled"
    payment.refresh_from_db()
    assert payment.status == "voided"
    assert money(wallet) == (5000, 0, 5000)


def test_check_ledger_exits_1_when_held_is_corrupted():
    from django.core.management import CommandError, call_command

    user, _, wallet = customer("alice", balance=5000)
    authorize(user, 1000)
    call_command("check_ledger", stdout=StringIO(), stderr=StringIO())
    with connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_account SET held = 0 WHERE id = %s", [wallet.pk])
    out = StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("check_ledger", stdout=out, stderr=StringIO())
    assert failed.value.returncode == 1
    report = json.loads(out.getvalue())
    assert report["violations"] == [
        f"account {wallet.pk} held 0 != sum of its active holds 1000"
    ]


@pytest.mark.django_db(transaction=True)
def test_authorize_racing_cancel_never_leaves_money_held(on_postgres):
    user, _, wallet = customer("alice", balance=100_000)
    for _ in range(4):
        order = place_order(user, amount=1000)

        def work(i: int, order_id=order.pk):
            if i == 0:
                return order_cancel(order_id=order_id)
            return payment_authorize_with_balance(order_id=order_id, hold_seconds=60)

        run_in_threads(2, work)
        # Whichever came first, the order ends cancelled and nothing stays held:
        # a cancel after the authorization voids it.
        assert order_status(order) == "cancelled"
        assert set(order.payments.values_list("status", flat=True)) <= {"voided"}
    assert money(wallet) == (100_000, 0, 100_000)
    assert_ledger_ok()


@pytest.mark.django_db(transaction=True)
def test_authorize_racing_the_unpaid_order_expiry_agree(on_postgres):
    user, _, wallet = customer("alice", balance=100_000)
    for _ in range(4):
        order = place_order(user, amount=1000)
        Order.objects.filter(pk=order.pk).update(
            created_at=timezone.now() - timedelta(days=2)
        )

        def work(i: int, order_id=order.pk):
            if i == 0:
                return order_cancel_expired(older_than_seconds=DAY)
            return payment_authorize_with_balance(order_id=order_id, hold_seconds=60)

        cancelled, authorized = run_in_threads(2, work)
        if order_status(order) == "authorized":
            assert isinstance(authorized, Payment) and cancelled == 0
        else:
            assert order_status(order) == "cancelled" and cancelled == 1
            assert not order.payments.exists()
    _, held, _ = money(wallet)
    assert held == 1000 * Payment.objects.filter(status="authorized").count()
    assert_ledger_ok()


def test_holds_are_listed_read_only_in_the_admin(admin_client):
    user, _, _ = customer("alice", balance=5000)
    _, payment = authorize(user, 1000)
    page = admin_client.get("/admin/ledger/hold/?status__exact=active")
    assert (
        page.status_code == 200 and f"hold:{payment.order_id}" in page.content.decode()
    )
    change = admin_client.get(f"/admin/ledger/hold/{payment.hold_id}/change/")
    assert change.status_code == 200 and b'name="_save"' not in change.content
    assert (
        admin_client.get(f"/admin/payments/payment/{payment.pk}/change/").status_code
        == 200
    )


def test_a_provider_success_for_an_authorized_order_is_refunded(
    django_capture_on_commit_callbacks,
):
    from payments.services import payment_settle
    from tests.helpers import pending_provider_payment

    user, _, wallet = customer("alice", balance=5000)
    order = place_order(user, amount=1000)
    provider = pending_provider_payment(order, txn="P-1")
    with django_capture_on_commit_callbacks() as sent, transaction.atomic():
        payment_authorize_with_balance(order_id=order.pk, hold_seconds=DAY)
    assert len(sent) == 1  # the open provider charge is cancelled after commit
    with transaction.atomic():
        settled = payment_settle(payment_id=provider.pk, provider_txn_id="P-1")
    assert settled.status == "refunded"
    assert settled.refund_record.reason == "order_authorized"
    assert order_status(order) == "authorized"
    assert money(wallet) == (5000, 1000, 4000)
    assert_ledger_ok()


@pytest.mark.django_db(transaction=True)
def test_captures_crossing_payments_and_refunds_never_deadlock(on_postgres):
    # The shop's account first, so its id is below the wallet's: a payment or a
    # refund then updates the merchant before the wallet. A capture releasing the
    # hold on the wallet before touching the merchant would deadlock with them.
    merchant_account(currency="CNY")
    user, _, wallet = customer("alice", balance=1_000_000)
    for _ in range(3):
        holds = [authorize(user, 1000)[1] for _ in range(3)]
        paid = [place_order(user, amount=500) for _ in range(3)]
        refunded = [
            payment_pay_with_balance(order_id=place_order(user).pk) for _ in range(3)
        ]

        def work(i: int, holds=holds, paid=paid, refunded=refunded):
            from payments.services import payment_refund

            kind, n = divmod(i, 3)
            if kind == 0:
                return payment_capture(payment_id=holds[n].pk)
            if kind == 1:
                return payment_pay_with_balance(order_id=paid[n].pk)
            return payment_refund(payment_id=refunded[n].pk)

        results = run_in_threads(9, work)
        assert not [r for r in results if isinstance(r, Exception)], results
    assert money(wallet)[1] == 0
    assert_ledger_ok()


def test_a_transfer_needs_available_money_too():
    user, client, wallet = customer("alice", balance=1500)
    customer("bob")
    pay(client, place_order(user, amount=1000))
    body = {"to": "bob", "amount": 600, "currency": "CNY"}
    refused = client.post(
        "/api/v1/transfers", body, format="json", headers={"Idempotency-Key": new_key()}
    )
    assert_problem(refused, 422, "insufficient_funds")
    body["amount"] = 500
    sent = client.post(
        "/api/v1/transfers", body, format="json", headers={"Idempotency-Key": new_key()}
    )
    assert sent.status_code == 201, sent.content
    assert money(wallet) == (1000, 1000, 0)
    assert_ledger_ok()


@pytest.mark.django_db(transaction=True)
def test_staff_capturing_and_voiding_one_payment_at_once_move_it_once(
    admin_user, on_postgres
):
    """Four staff members' clicks at the same instant, two capture and two void
    (the admin's actions, each its own request): one wins, the others are told
    the payment moved on, nothing fails."""
    from django.test import Client

    user, _, wallet = customer("alice", balance=5000)
    order, payment = authorize(user, 1000)

    def click(i: int) -> str:
        client = Client()
        client.force_login(admin_user)
        response = client.post(
            "/admin/payments/payment/",
            {"action": "capture" if i % 2 else "void", "_selected_action": payment.pk},
            follow=True,
        )
        assert response.status_code == 200
        # (The page, not `response.context`: the test client collects the contexts
        # of every thread's templates.)
        return html.unescape(response.content.decode())

    pages = run_in_threads(4, click)
    made = [p for p in pages if re.search(r"(Captured|Voided): 1, skipped: 0\.", p)]
    assert len(made) == 1, pages
    assert all("skipped: 1." in p for p in pages if p not in made)
    payment.refresh_from_db()
    if "Captured: 1" in made[0]:
        assert (payment.status, order_status(order)) == ("succeeded", "paid")
        assert money(wallet) == (4000, 0, 4000)
    else:
        assert (payment.status, order_status(order)) == ("voided", "cancelled")
        assert money(wallet) == (5000, 0, 5000)
    assert_ledger_ok()
