"""`check_ledger` names a charge the provider reported collected that no payment
booked.

An answer about a charge that is not its payment's changes nothing
(`tests/payments/test_settle_other_charge.py`): a callback's event is processed
with its own outcome, a re-drive's or the reconciliation's answer is kept on its
payment. When such an answer says the charge was collected (SUCCESS) and no
payment of ours has booked that transaction, the provider may hold money the
ledger never recorded: a warning names the transaction, its order and where it
was heard, until a payment books it. The ledger's invariants still hold.
"""

from io import StringIO

import pytest
from django.core.management import call_command

from ledger.invariants import ledger_report
from payments import services
from payments.models import Payment
from payments.services import payment_record_charge, payment_redrive
from tests.helpers import (
    assert_settled_once,
    customer,
    event_body,
    pending_provider_payment,
    place_order,
)
from tests.payments.test_settle_other_charge import (
    AMOUNT,
    charge,
    opened_without_charge,
    process,
    stored,
)

pytestmark = pytest.mark.django_db

CHECK = "collected_charges_booked_by_no_payment"


def named() -> list[str]:
    """The warnings of the check, from the report `check_ledger` prints; the ledger
    itself is sound."""
    report = ledger_report()
    assert report["ok"], report
    assert CHECK in report["warning_checks"]
    return [w for w in report["warnings"] if w.startswith("provider charge ")]


def redriven(payment: Payment, monkeypatch, *answers) -> None:
    """Beat's re-drive (or, for a settled payment, the reconciliation) asks the
    provider (its client stubbed) once per answer."""
    replies = iter(answers)
    monkeypatch.setattr(services, "provider_charge_get", lambda **_: next(replies))
    for _ in answers:
        payment_redrive(payment_id=payment.pk)


def test_a_callback_about_another_charge_collected_is_named_by_check_ledger():
    """A success callback about T1 stored before the payment recorded T2: the event
    changes nothing, and check_ledger names T1 and the order, also once T2's own
    success has settled the payment (T1 is still booked by no one). The command
    exits 0: a warning, not a violation."""
    user, _, _ = customer("ann")
    payment = opened_without_charge(place_order(user, amount=AMOUNT))
    other = stored(event_body(payment, provider_txn_id="T1"))
    payment = payment_record_charge(
        payment_id=payment.pk, provider_txn_id="T2", pay_url="http://pay.example/p/2"
    )
    assert named() == []
    process(other)
    no = payment.order.merchant_order_no
    expected = [
        f"provider charge 'T1' (order {no}) reported collected "
        f"(event {other.event_id!r}) but booked by no payment: the provider may "
        "hold money the ledger never recorded"
    ]
    assert named() == expected
    process(stored(event_body(payment)))
    assert_settled_once(payment)
    assert named() == expected
    out, err = StringIO(), StringIO()
    call_command("check_ledger", stdout=out, stderr=err)
    assert f"warning: {expected[0]}" in err.getvalue().splitlines()
    assert "violation" not in err.getvalue()


def test_redrive_and_reconciliation_answers_collected_are_named(monkeypatch):
    """A pending payment's re-drive hears that T1, not its T2, was collected; a
    settled payment's reconciliation hears that T6, not the T5 it booked, was:
    both are named with their orders. Heard again, a charge is named once."""
    user, _, _ = customer("bea")
    pending = pending_provider_payment(place_order(user, amount=AMOUNT), txn="T2")
    redriven(pending, monkeypatch, *[charge(pending, "T1")] * 2)
    pending.refresh_from_db()
    assert pending.status == Payment.Status.PENDING

    settled = pending_provider_payment(place_order(user, amount=AMOUNT), txn="T5")
    process(stored(event_body(settled)))
    redriven(settled, monkeypatch, charge(settled, "T6"))
    settled.refresh_from_db()
    assert settled.status == Payment.Status.SUCCEEDED

    warnings = named()
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith(
        f"provider charge 'T1' (order {pending.order.merchant_order_no}) reported "
        f"collected (re-drive of payment {pending.pk}) but booked by no payment"
    )
    assert warnings[1].startswith(
        f"provider charge 'T6' (order {settled.order.merchant_order_no}) reported "
        f"collected (re-drive of payment {settled.pk}) but booked by no payment"
    )


def test_a_charge_booked_declined_or_given_back_is_not_named(monkeypatch):
    """Not named: a success callback naming a transaction another order's payment
    booked; a failure callback about another charge; a re-drive hearing another
    charge declined, or collected and refunded at the provider."""
    user, _, _ = customer("cal")
    elsewhere = pending_provider_payment(place_order(user, amount=AMOUNT), txn="TB")
    process(stored(event_body(elsewhere)))
    payment = opened_without_charge(place_order(user, amount=AMOUNT))
    process(stored(event_body(payment, provider_txn_id="TB")))
    declined = opened_without_charge(place_order(user, amount=AMOUNT))
    failure = stored(event_body(declined, provider_txn_id="TF", status="FAILED"))
    payment_record_charge(
        payment_id=declined.pk, provider_txn_id="T2", pay_url="http://pay.example/p"
    )
    process(failure)
    asked = pending_provider_payment(place_order(user, amount=AMOUNT), txn="T3")
    redriven(
        asked,
        monkeypatch,
        charge(asked, "T7", "FAILED"),
        charge(asked, "T8", "REFUNDED"),
    )
    asked.refresh_from_db()
    assert (asked.other_charge_txn_id, asked.other_charge_status) == ("T8", "REFUNDED")
    assert named() == []
