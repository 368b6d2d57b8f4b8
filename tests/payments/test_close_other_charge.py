"""A provider's answer about a charge that is not the payment's closes nothing.

The rule `payment_settle` keeps (an answer about another transaction than the
payment recorded, or, none recorded, one that a payment of another order recorded,
changes nothing) holds for failures and cancels too: a FAILED callback stored
before the payment recorded its charge, a re-drive's FAILED or CANCELLED answer
about another charge of the order. Closed by it, the payment would let its order
take a new payment, whose charge (a provider that opens one per attempt) makes the
callback of the first payment's own success refused, its money never booked. An
answer naming no charge, or the payment's own, closes it as before.

The callback event such an answer came in is processed, never applied or retried,
with an outcome of its own that the admin lists and filters and `/metrics` counts.
"""

import pytest

from ledger.invariants import ledger_report
from orders.models import Order
from payments import services
from payments.models import Payment, ProviderEvent
from payments.services import (
    payment_apply_charge,
    payment_provider_start,
    payment_record_charge,
    payment_redrive,
    provider_event_process,
)
from tests.conftest import run_in_threads
from tests.helpers import (
    assert_settled_once,
    customer,
    event_body,
    gauge,
    pending_provider_payment,
    place_order,
    post_callback,
)
from tests.payments.test_settle_other_charge import (
    AMOUNT,
    charge,
    opened_without_charge,
    process,
    stored,
    unsettled,
)

pytestmark = pytest.mark.django_db

EVENTS = "/admin/payments/providerevent/"
NOT_ITS_CHARGE = "not the payment's charge"


def failure_stored_before_its_charge(name: str) -> tuple[Payment, ProviderEvent]:
    """A payment that recorded its charge T2 after a FAILED callback about T1 was
    stored for it (nothing to tell the two apart then); that event."""
    user, _, _ = customer(name)
    payment = opened_without_charge(place_order(user, amount=AMOUNT))
    failure = stored(event_body(payment, provider_txn_id="T1", status="FAILED"))
    payment = payment_record_charge(
        payment_id=payment.pk, provider_txn_id="T2", pay_url="http://pay.example/p/2"
    )
    return payment, failure


def outcome(event: ProviderEvent) -> tuple[str, str]:
    event.refresh_from_db()
    return event.status, event.outcome


def test_a_failure_of_another_charge_leaves_the_payment_pending(caplog, client):
    """Processed, and again (a redelivered task), and delivered again: the payment
    stays pending, the event is processed with its own outcome, counted and named
    in the log; the payment's own success then settles it once."""
    payment, failure = failure_stored_before_its_charge("ann")
    assert gauge("payments_provider_events_not_its_charge", client) == 0
    for _ in range(2):
        process(failure)
        unsettled(payment)
        assert outcome(failure) == ("processed", NOT_ITS_CHARGE)
    assert post_callback(failure.payload).status_code == 200
    assert ProviderEvent.objects.filter(event_id=failure.event_id).count() == 1
    assert "T1" in caplog.text and "T2" in caplog.text
    assert gauge("payments_provider_events_not_its_charge", client) == 1

    own = stored(event_body(payment))
    process(own)
    assert_settled_once(payment)
    assert outcome(own) == ("processed", "payment succeeded")
    assert outcome(failure) == ("processed", NOT_ITS_CHARGE)
    assert gauge("payments_provider_events_not_its_charge", client) == 1


def test_the_order_takes_no_new_payment_and_its_own_success_is_booked():
    """The failure of T1 left the payment open: a second pay request continues it
    (the provider's next charge, T3, is not recorded over T2), and T2's success
    callback is acknowledged and settles it, once."""
    payment, failure = failure_stored_before_its_charge("bea")
    process(failure)
    again = payment_provider_start(order_id=payment.order_id)
    again = payment_record_charge(
        payment_id=again.pk, provider_txn_id="T3", pay_url="http://pay.example/p/3"
    )
    assert again.pk == payment.pk
    assert again.provider_txn_id == "T2"
    response = post_callback(event_body(payment))
    assert response.status_code == 200, response.content
    process(ProviderEvent.objects.order_by("-pk").first())
    assert_settled_once(payment)


def test_a_failure_naming_another_orders_charge_leaves_the_payment_pending():
    """None recorded yet, a FAILED callback names a transaction another order's
    payment recorded: not this payment's charge."""
    user, _, _ = customer("cal")
    pending_provider_payment(place_order(user, amount=AMOUNT), txn="TB")
    payment = opened_without_charge(place_order(user, amount=AMOUNT))
    failure = stored(event_body(payment, provider_txn_id="TB", status="FAILED"))
    process(failure)
    unsettled(payment)
    assert outcome(failure) == ("processed", NOT_ITS_CHARGE)


@pytest.mark.parametrize("status", ["FAILED", "CANCELLED"])
def test_a_redrive_answer_about_another_charge_closes_nothing(status, caplog):
    """Beat's re-drive hears that T1 was declined or cancelled; the payment, whose
    charge T2 was recorded before it asked, stays pending, however often; its own
    charge's success settles it."""
    user, _, _ = customer("dan")
    payment = pending_provider_payment(place_order(user, amount=AMOUNT), txn="T2")
    for _ in range(2):
        answered = payment_apply_charge(
            payment_id=payment.pk,
            charge=charge(payment, "T1", status),
            recorded_txn_id="T2",
        )
        assert answered.status == Payment.Status.PENDING
    unsettled(payment)
    assert "T1" in caplog.text
    payment_apply_charge(payment_id=payment.pk, charge=charge(payment, "T2"))
    assert_settled_once(payment)


@pytest.mark.parametrize("status", ["FAILED", "CANCELLED"])
def test_the_redrive_asking_the_provider_closes_nothing_for_another_charge(
    status, monkeypatch
):
    """The whole re-drive: the provider (its client stubbed) speaks of T1."""
    user, _, _ = customer("eve")
    payment = pending_provider_payment(place_order(user, amount=AMOUNT), txn="T2")
    monkeypatch.setattr(
        services, "provider_charge_get", lambda **_: charge(payment, "T1", status)
    )
    assert payment_redrive(payment_id=payment.pk).status == Payment.Status.PENDING
    unsettled(payment)


@pytest.mark.parametrize(
    ("status", "closed"),
    [("FAILED", Payment.Status.FAILED), ("CANCELLED", Payment.Status.CANCELLED)],
)
def test_an_answer_about_its_own_charge_or_none_closes_it_as_before(status, closed):
    """Pinned: the payment's own charge declined or cancelled closes it; so does
    "no charge at all" (while it recorded none since the provider was asked)."""
    user, _, _ = customer("fay")
    own = pending_provider_payment(place_order(user, amount=AMOUNT), txn="T2")
    answered = payment_apply_charge(
        payment_id=own.pk, charge=charge(own, "T2", status), recorded_txn_id="T2"
    )
    assert answered.status == closed
    nothing = opened_without_charge(place_order(user, amount=AMOUNT))
    answered = payment_apply_charge(
        payment_id=nothing.pk, charge=None, recorded_txn_id=""
    )
    assert answered.status == Payment.Status.FAILED


@pytest.mark.parametrize("recorded", ["T2", ""])
def test_a_failure_callback_about_its_own_charge_fails_it(recorded):
    """Pinned: a FAILED callback naming the payment's own transaction fails it, and
    reads as before; so does one naming a transaction no other order's payment
    recorded, on a payment that recorded none yet (taken as its own)."""
    user, _, _ = customer("gus")
    order = place_order(user, amount=AMOUNT)
    if recorded:
        payment = pending_provider_payment(order, txn=recorded)
    else:
        payment = opened_without_charge(order)
    failure = stored(event_body(payment, provider_txn_id="T2", status="FAILED"))
    process(failure)
    payment.refresh_from_db()
    assert payment.status == Payment.Status.FAILED
    assert outcome(failure) == ("processed", "payment failed")


def test_the_admin_lists_and_filters_events_about_another_charge(admin_client):
    payment, failure = failure_stored_before_its_charge("hal")
    process(failure)
    own = stored(event_body(payment))
    process(own)
    page = admin_client.get(EVENTS).content.decode()
    assert NOT_ITS_CHARGE.replace("'", "&#x27;") in page
    filtered = admin_client.get(EVENTS, {"another_charge": "yes"})
    assert filtered.status_code == 200
    text = filtered.content.decode()
    assert failure.event_id in text
    assert own.event_id not in text


@pytest.mark.django_db(transaction=True)
def test_a_failure_of_another_charge_racing_its_own_success_settles_it_once(
    on_postgres,
):
    """The stored FAILED event about T1, the payment's own success event, and
    re-drives hearing that T1 was declined or cancelled, all at once: whoever is
    first, the payment is never closed, and ends settled by T2, booked once."""
    payment, failure = failure_stored_before_its_charge("ivy")
    own = stored(event_body(payment))

    def work(i: int) -> str:
        if i < 2:
            return provider_event_process(event_id=(failure, own)[i].pk).status
        status = "FAILED" if i % 2 == 0 else "CANCELLED"
        return payment_apply_charge(
            payment_id=payment.pk,
            charge=charge(payment, "T1", status),
            recorded_txn_id="T2",
        ).status

    results = run_in_threads(8, work)
    assert not [r for r in results if isinstance(r, Exception)], results
    assert results[:2] == ["processed", "processed"]
    assert set(results[2:]) <= {Payment.Status.PENDING, Payment.Status.SUCCEEDED}
    assert_settled_once(payment)
    payment.refresh_from_db()
    assert payment.provider_txn_id == "T2"
    assert outcome(failure) == ("processed", NOT_ITS_CHARGE)
    assert outcome(own) == ("processed", "payment succeeded")
    assert Order.objects.get(pk=payment.order_id).status == Order.Status.PAID
    assert ledger_report()["ok"]


def test_the_admin_filters_events_by_what_they_report(admin_client):
    payment, failure = failure_stored_before_its_charge("ivy")
    own = stored(event_body(payment))
    failed = admin_client.get(EVENTS, {"kind": "FAILED"}).content.decode()
    assert failure.event_id in failed and own.event_id not in failed
    succeeded = admin_client.get(EVENTS, {"kind": "SUCCESS"}).content.decode()
    assert own.event_id in succeeded and failure.event_id not in succeeded


PAYMENTS = "/admin/payments/payment/"
ANSWERS_GAUGE = "payments_provider_answers_not_its_charge"


def test_a_redrive_answer_about_another_charge_is_kept_counted_and_filtered(
    monkeypatch, admin_client
):
    """Beat's re-drive hears of T1, not the payment's T2: nothing changes, but the
    payment keeps the answer, `/metrics` counts it and the admin filters it. The
    same answer again is one payment counted; a later answer about yet another
    charge, collected and refunded or not collected, leaves the collected T1
    named; T1's own refund replaces it. A callback about another charge stays on
    its event only."""
    user, _, _ = customer("jon")
    payment = pending_provider_payment(place_order(user, amount=AMOUNT), txn="T2")
    by_callback, failure = failure_stored_before_its_charge("kim")
    process(failure)
    assert gauge(ANSWERS_GAUGE, admin_client) == 0
    answers = iter(
        [
            charge(payment, "T1", "FAILED"),
            charge(payment, "T1", "FAILED"),
            charge(payment, "T1", "SUCCESS"),
            charge(payment, "T3", "CANCELLED"),
            charge(payment, "T3", "REFUNDED"),
            charge(payment, "T1", "REFUNDED"),
        ]
    )
    monkeypatch.setattr(services, "provider_charge_get", lambda **_: next(answers))
    heard = []
    for _ in range(6):
        assert payment_redrive(payment_id=payment.pk).status == Payment.Status.PENDING
        payment.refresh_from_db()
        heard.append((payment.other_charge_txn_id, payment.other_charge_status))
    assert heard == [
        ("T1", "FAILED"),
        ("T1", "FAILED"),
        ("T1", "SUCCESS"),
        ("T1", "SUCCESS"),
        ("T1", "SUCCESS"),
        ("T1", "REFUNDED"),
    ]
    unsettled(payment)
    by_callback.refresh_from_db()
    assert by_callback.other_charge_txn_id == ""
    assert gauge(ANSWERS_GAUGE, admin_client) == 1

    listed = admin_client.get(PAYMENTS, {"another_charge": "yes"})
    assert listed.status_code == 200
    text = listed.content.decode()
    assert f"{PAYMENTS}{payment.pk}/change/" in text
    assert f"{PAYMENTS}{by_callback.pk}/change/" not in text
    page = admin_client.get(f"{PAYMENTS}{payment.pk}/change/").content.decode()
    assert "T1" in page and "REFUNDED" in page
