"""A provider's answer settles only the payment whose charge it is about.

`payment_settle` is reached by the callbacks (stored in the inbox, processed later),
beat's re-drive and reconciliation (the provider's view of the order's charge) and
the cancel of an open charge. Each names a provider transaction. A payment that
recorded another transaction (its pay request recorded the charge the provider
opened for it) is not settled by an answer about that one: the money it names is
not this payment's, and booking it would book money this payment never collected,
or book a charge that another payment booked already. A payment that recorded no
transaction yet is not settled by one that a payment of another order recorded.
Every charge's money is booked at most once.
"""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger.invariants import ledger_report
from ledger.models import JournalEntry
from ledger.services import external_account, merchant_account
from orders.models import Order
from payments.models import Payment, ProviderEvent
from payments.provider_client import ProviderCharge
from payments.services import (
    payment_apply_charge,
    payment_fail,
    payment_provider_start,
    payment_record_charge,
    provider_event_process,
    provider_reference,
)
from tests.conftest import run_in_threads
from tests.helpers import (
    assert_settled_once,
    balance,
    customer,
    event_body,
    pending_provider_payment,
    place_order,
    post_callback,
)

pytestmark = pytest.mark.django_db

AMOUNT = 1200


def charge(payment: Payment, txn: str, status: str = "SUCCESS") -> ProviderCharge:
    """The provider's answer about transaction `txn` under the payment's order."""
    return ProviderCharge(
        txn_id=txn,
        merchant_order_no=payment.order.merchant_order_no,
        amount=payment.amount,
        status=status,
        pay_url="http://pay.example/p/other",
    )


def process(*events: ProviderEvent) -> None:
    for event in events:
        provider_event_process(event_id=event.pk)


def stored(body: dict) -> ProviderEvent:
    """Deliver a callback; the inbox's event it stored."""
    response = post_callback(body)
    assert response.status_code == 200, response.content
    return ProviderEvent.objects.get(event_id=body["event_id"])


def unsettled(payment: Payment) -> None:
    """The payment took no money: still pending, no entry of its own."""
    payment.refresh_from_db()
    assert payment.status == Payment.Status.PENDING
    assert payment.journal_entry_id is None
    assert not JournalEntry.objects.filter(
        reference=provider_reference(payment)
    ).exists()


def opened_without_charge(order: Order) -> Payment:
    """The order's provider payment as the pay request's first step leaves it: the
    provider not asked yet, no transaction recorded."""
    payment = payment_provider_start(order_id=order.pk)
    assert payment.provider_txn_id == ""
    return Payment.objects.select_related("order").get(pk=payment.pk)


@pytest.mark.parametrize("status", ["SUCCESS", "REFUNDED"])
def test_an_answer_about_another_charge_does_not_settle_a_pending_payment(
    status, caplog
):
    """Beat's re-drive hears of another transaction than the one the payment
    recorded: nothing is booked, the payment stays pending, and its own charge's
    success settles it once."""
    user, _, _ = customer("ann")
    payment = pending_provider_payment(place_order(user, amount=AMOUNT), txn="T2")
    for _ in range(2):
        answered = payment_apply_charge(
            payment_id=payment.pk, charge=charge(payment, "T1", status)
        )
        assert answered.status == Payment.Status.PENDING
    unsettled(payment)
    assert Order.objects.get(pk=payment.order_id).status == Order.Status.PENDING_PAYMENT
    assert "T1" in caplog.text
    payment_apply_charge(payment_id=payment.pk, charge=charge(payment, "T2"))
    assert_settled_once(payment)
    payment.refresh_from_db()
    assert payment.provider_txn_id == "T2"


def test_a_callback_stored_before_the_charge_was_recorded_settles_only_its_charge():
    """A callback about T1 reaches the inbox while the payment has recorded no
    charge yet (nothing to tell it from); its pay request then records T2, the
    charge the provider opened for it. The T1 event settles nothing; T2's money,
    when it comes, is booked, once."""
    user, _, _ = customer("bea")
    payment = opened_without_charge(place_order(user, amount=AMOUNT))
    other = stored(event_body(payment, provider_txn_id="T1"))
    payment = payment_record_charge(
        payment_id=payment.pk, provider_txn_id="T2", pay_url="http://pay.example/p/2"
    )
    process(other)
    unsettled(payment)
    assert balance(merchant_account(currency="CNY")) == 0
    process(stored(event_body(payment)))
    assert_settled_once(payment)
    payment.refresh_from_db()
    assert payment.provider_txn_id == "T2"


def test_a_charge_of_an_earlier_payment_is_not_booked_again_by_a_later_one():
    """Two payments of one order: the first (T1) declined, then confirmed at the
    provider after all, its success stored for it; the second, opened meanwhile,
    gets a second success event for T1 before its request records its own charge
    T2. T1 is booked once, by the first; the second books nothing."""
    user, _, _ = customer("cal")
    order = place_order(user, amount=AMOUNT)
    first = pending_provider_payment(order, txn="T1")
    process(stored(event_body(first, status="FAILED")))
    first_success = stored(event_body(first))
    second = opened_without_charge(order)
    assert second.pk != first.pk
    second_success = stored(event_body(second, provider_txn_id="T1"))
    assert second_success.payment_id == second.pk
    payment_record_charge(
        payment_id=second.pk, provider_txn_id="T2", pay_url="http://pay.example/p/2"
    )
    process(first_success, second_success)
    assert_settled_once(first)
    unsettled(second)
    assert JournalEntry.objects.filter(kind=JournalEntry.Kind.PAYMENT).count() == 1
    assert balance(external_account(currency="CNY")) == -AMOUNT
    assert ledger_report()["ok"]


def test_a_transaction_of_another_order_does_not_settle_a_payment():
    """A callback for this order's number names a transaction that another order's
    payment recorded (and was settled by): not this payment's charge, and never
    booked twice; the payment later records and is settled by its own."""
    user, _, _ = customer("dan")
    elsewhere = pending_provider_payment(place_order(user, amount=AMOUNT), txn="TB")
    process(stored(event_body(elsewhere)))
    assert_settled_once(elsewhere)
    payment = opened_without_charge(place_order(user, amount=AMOUNT))
    process(stored(event_body(payment, provider_txn_id="TB")))
    unsettled(payment)
    assert JournalEntry.objects.filter(kind=JournalEntry.Kind.PAYMENT).count() == 1
    payment = payment_record_charge(
        payment_id=payment.pk, provider_txn_id="TA", pay_url="http://pay.example/p/a"
    )
    assert payment.provider_txn_id == "TA"
    process(stored(event_body(payment)))
    payment.refresh_from_db()
    assert payment.status == Payment.Status.SUCCEEDED
    assert Order.objects.get(pk=payment.order_id).status == Order.Status.PAID
    assert JournalEntry.objects.filter(kind=JournalEntry.Kind.PAYMENT).count() == 2
    assert balance(merchant_account(currency="CNY")) == 2 * AMOUNT
    assert ledger_report()["ok"]


@pytest.mark.django_db(transaction=True)
def test_answers_about_two_charges_racing_book_the_payments_own_once(on_postgres):
    """The stored event about T1, the payment's own T2 event, and re-drives hearing
    of each, all at once: the payment ends settled by T2, booked once."""
    user, _, _ = customer("eli")
    payment = opened_without_charge(place_order(user, amount=AMOUNT))
    other = stored(event_body(payment, provider_txn_id="T1"))
    payment = payment_record_charge(
        payment_id=payment.pk, provider_txn_id="T2", pay_url="http://pay.example/p/2"
    )
    own = stored(event_body(payment))

    def work(i: int) -> str:
        if i < 2:
            return provider_event_process(event_id=(other, own)[i].pk).status
        txn = "T1" if i % 2 == 0 else "T2"
        return payment_apply_charge(
            payment_id=payment.pk, charge=charge(payment, txn)
        ).status

    results = run_in_threads(6, work)
    assert not [r for r in results if isinstance(r, Exception)], results
    assert_settled_once(payment)
    payment.refresh_from_db()
    assert payment.provider_txn_id == "T2"


def test_a_failure_then_a_success_of_the_same_charge_settles_the_payment():
    """Pinned as it was: the payer declined, then confirmed the same charge (the
    provider reopens it): the payment's own transaction settles it from failed."""
    user, _, _ = customer("fox")
    payment = pending_provider_payment(place_order(user, amount=AMOUNT), txn="T9")
    payment_fail(payment_id=payment.pk)
    process(stored(event_body(payment)))
    assert_settled_once(payment)


def asked_whose_charge(queries: CaptureQueriesContext) -> int:
    """How many of `queries` asked whether a payment of another order recorded a
    transaction (`_not_its_charge`, for a payment with none recorded)."""
    return sum(
        'NOT ("payments_payment"."order_id" =' in query["sql"]
        for query in queries.captured_queries
    )


@pytest.mark.parametrize("status", ["SUCCESS", "FAILED"])
def test_an_answer_on_a_payment_with_no_charge_recorded_is_checked_once(status):
    """A callback's event, and beat's re-drive, about a payment that recorded no
    charge yet ask once whether its transaction is another order's: the event's
    check (or the re-drive's) stands for the settlement or the failure it leads
    to, under the same locks."""
    user, _, _ = customer("gus")
    by_callback = opened_without_charge(place_order(user, amount=AMOUNT))
    event = stored(event_body(by_callback, provider_txn_id="TC", status=status))
    with CaptureQueriesContext(connection) as queries:
        process(event)
    assert asked_whose_charge(queries) == 1
    by_callback.refresh_from_db()
    assert by_callback.status == status.lower().replace("success", "succeeded")

    by_redrive = opened_without_charge(place_order(user, amount=AMOUNT))
    with CaptureQueriesContext(connection) as queries:
        answered = payment_apply_charge(
            payment_id=by_redrive.pk,
            charge=charge(by_redrive, "TR", status),
            recorded_txn_id="",
        )
    assert asked_whose_charge(queries) == 1
    assert answered.status == by_callback.status
