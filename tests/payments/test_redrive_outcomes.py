"""Beat's re-drive brings every pending provider payment to an end, the one its
callbacks would reach, through the same services, once.

The provider may answer that it collected another amount than we asked, or that
it collected the money and refunded it since: neither is left `pending` to be asked
about again every rotation. Another amount is never kept as the order's payment: it
is booked and given back at once, and `check_ledger` names it until the provider
has returned it. A charge refunded at the provider refunds the payment and its order
here, whether the success callback came first, at the same moment, or never.

The first tests apply the provider's answers directly (any database); the rest ask
the simulator over real HTTP, on PostgreSQL, with threads racing.
"""

from dataclasses import replace

import pytest

from ledger.invariants import ledger_report
from ledger.models import JournalEntry
from ledger.services import external_account, merchant_account
from orders.models import Order
from orders.services import order_cancel
from payments.models import Payment, ProviderEvent, Refund, Shipment
from payments.provider.models import Charge, Notification
from payments.provider.services import notification_deliver
from payments.provider_client import ProviderCharge, provider_charge_refund
from payments.services import (
    payment_apply_charge,
    payment_redrive,
    payment_settle,
    payments_stuck,
    provider_event_process,
    provider_reference,
    refund_reference,
)
from payments.tasks import payment_redrive_task, refund_return_at_provider_task
from tests.conftest import run_in_threads
from tests.helpers import (
    assert_problem,
    balance,
    customer,
    event_body,
    pending_provider_payment,
    place_order,
    post_callback,
)
from tests.payments.test_beat import age, settle_at_provider
from tests.payments.test_cancel import provider_pending

ASKED = 1000
COLLECTED = 1500


def answer(payment: Payment, status: str, amount: int | None = None) -> ProviderCharge:
    """What the provider says of the payment's charge."""
    return ProviderCharge(
        txn_id=payment.provider_txn_id,
        merchant_order_no=payment.order.merchant_order_no,
        amount=payment.amount if amount is None else amount,
        status=status,
        pay_url=payment.pay_url,
    )


def entries_of(payment: Payment) -> list[str]:
    references = [provider_reference(payment), refund_reference(payment)]
    return sorted(
        JournalEntry.objects.filter(reference__in=references).values_list(
            "reference", flat=True
        )
    )


def state(payment: Payment) -> dict:
    """Everything a re-drive or a callback may have changed, in one comparable
    value."""
    payment.refresh_from_db()
    order = Order.objects.get(pk=payment.order_id)
    refund = Refund.objects.filter(payment=payment).first()
    return {
        "payment": (payment.status, payment.amount),
        "order": order.status,
        "entries": entries_of(payment),
        "refund": refund and (refund.amount, refund.reason),
        "shipment": list(
            Shipment.objects.filter(order=order).values_list("status", flat=True)
        ),
        "merchant": balance(merchant_account(currency="CNY")),
        "external": balance(external_account(currency="CNY")),
    }


def assert_given_back_not_kept(payment: Payment) -> None:
    """A charge of another amount: booked, refunded, the order untouched."""
    assert state(payment) == {
        "payment": (Payment.Status.REFUNDED, COLLECTED),
        "order": Order.Status.PENDING_PAYMENT,
        "entries": [provider_reference(payment), refund_reference(payment)],
        "refund": (COLLECTED, "amount_mismatch"),
        "shipment": [],
        "merchant": 0,
        "external": 0,
    }
    report = ledger_report()
    assert report["ok"], report["violations"]


def assert_refunded_as_at_the_provider(payment: Payment) -> None:
    """A charge collected and refunded at the provider: paid, then refunded, once."""
    assert state(payment) == {
        "payment": (Payment.Status.REFUNDED, ASKED),
        "order": Order.Status.REFUNDED,
        "entries": [provider_reference(payment), refund_reference(payment)],
        "refund": (ASKED, "refunded_at_provider"),
        "shipment": [Shipment.Status.CANCELLED],
        "merchant": 0,
        "external": 0,
    }
    # Given back by the provider already: not asked to give it back again.
    refund = Refund.objects.get(payment=payment)
    assert refund.at_provider == Refund.AtProvider.RETURNED, refund.at_provider
    report = ledger_report()
    assert report["ok"], report["violations"]
    assert not report["warnings"], report["warnings"]


@pytest.mark.django_db
def test_another_amount_is_given_back_and_named_until_returned():
    user, _, _ = customer("ada")
    payment = pending_provider_payment(place_order(user, amount=ASKED))
    payment_apply_charge(
        payment_id=payment.pk, charge=answer(payment, "SUCCESS", COLLECTED)
    )
    assert_given_back_not_kept(payment)
    refund = Refund.objects.get(payment=payment)
    assert refund.at_provider == Refund.AtProvider.PENDING
    no = payment.order.merchant_order_no
    assert ledger_report()["warnings"] == [
        f"payment {payment.pk} (order {no}): the provider collected {COLLECTED}, "
        f"not the {ASKED} asked; its refund is pending at the provider"
    ]
    # Applied again (a repeated re-drive, the cancel task's answer): nothing more.
    payment_apply_charge(
        payment_id=payment.pk, charge=answer(payment, "SUCCESS", COLLECTED)
    )
    assert_given_back_not_kept(payment)
    # Once the provider has given it back, nothing is left for an operator.
    Refund.objects.filter(pk=refund.pk).update(at_provider=Refund.AtProvider.RETURNED)
    assert ledger_report()["warnings"] == []


@pytest.mark.django_db
def test_the_late_callback_of_another_amount_changes_nothing():
    """Refused while the payment waited for the amount asked, the provider's
    callback for what it collected is acknowledged once the re-drive has given that
    back, and changes nothing more."""
    user, _, _ = customer("bo")
    payment = pending_provider_payment(place_order(user, amount=ASKED))
    late = event_body(payment, amount=COLLECTED)
    assert_problem(post_callback(late), 400, "callback_mismatch")
    payment_apply_charge(
        payment_id=payment.pk, charge=answer(payment, "SUCCESS", COLLECTED)
    )
    assert post_callback(late).status_code == 200
    provider_event_process(event_id=ProviderEvent.objects.get().pk)
    assert_given_back_not_kept(payment)


@pytest.mark.django_db
def test_a_charge_refunded_at_the_provider_refunds_the_order_once():
    user, _, _ = customer("cy")
    payment = pending_provider_payment(place_order(user, amount=ASKED))
    for _ in range(2):
        payment_apply_charge(payment_id=payment.pk, charge=answer(payment, "REFUNDED"))
        assert_refunded_as_at_the_provider(payment)


@pytest.mark.django_db
def test_refunded_after_its_success_callback_ends_the_same():
    """The success callback settled it first (the order paid, its shipment made):
    the provider's refund then refunds it, to the same end as without it."""
    user, _, _ = customer("dee")
    payment = pending_provider_payment(place_order(user, amount=ASKED))
    assert post_callback(event_body(payment)).status_code == 200
    provider_event_process(event_id=ProviderEvent.objects.get().pk)
    assert Order.objects.get(pk=payment.order_id).status == Order.Status.PAID
    payment_apply_charge(payment_id=payment.pk, charge=answer(payment, "REFUNDED"))
    assert_refunded_as_at_the_provider(payment)
    # And the success again afterwards (a redelivered task): nothing moves.
    payment_settle(payment_id=payment.pk, provider_txn_id=payment.provider_txn_id)
    assert_refunded_as_at_the_provider(payment)


@pytest.mark.django_db
def test_a_refund_of_another_transaction_does_not_refund_a_settled_payment(caplog):
    """The provider's refund of a charge that is not the payment's (another
    transaction under the order's number) is not this payment's money coming back:
    nothing changes, as a success of another transaction changes nothing on a
    settled payment. Its own transaction refunded still refunds it."""
    user, _, _ = customer("dot")
    payment = pending_provider_payment(place_order(user, amount=ASKED))
    payment_apply_charge(payment_id=payment.pk, charge=answer(payment, "SUCCESS"))
    settled = state(payment)
    assert settled["payment"] == (Payment.Status.SUCCEEDED, ASKED)
    other = replace(answer(payment, "REFUNDED"), txn_id="txn-of-another-charge")
    for _ in range(2):
        again = payment_apply_charge(payment_id=payment.pk, charge=other)
        assert again.status == Payment.Status.SUCCEEDED
        assert state(payment) == settled
    assert "txn-of-another-charge" in caplog.text
    assert not Refund.objects.exists()
    assert ledger_report()["ok"]
    payment_apply_charge(payment_id=payment.pk, charge=answer(payment, "REFUNDED"))
    assert_refunded_as_at_the_provider(payment)


@pytest.mark.django_db
def test_a_refunded_charge_of_a_cancelled_order_is_a_late_success_given_back():
    user, _, _ = customer("eve")
    order = place_order(user, amount=ASKED)
    payment = pending_provider_payment(order)
    order_cancel(order_id=order.pk)
    payment_apply_charge(payment_id=payment.pk, charge=answer(payment, "REFUNDED"))
    after = state(payment)
    assert after["payment"] == (Payment.Status.REFUNDED, ASKED)
    assert after["order"] == Order.Status.CANCELLED
    assert after["refund"] == (ASKED, "order_cancelled")
    assert (after["merchant"], after["external"]) == (0, 0)
    assert ledger_report()["ok"]


@pytest.mark.django_db
def test_a_charge_booked_by_another_payment_is_not_booked_again():
    """Given back, the charge stays the order's at the provider: a later pay
    request, refused there and left pending, is asked about and fails; the charge
    is never booked twice."""
    user, _, _ = customer("fay")
    order = place_order(user, amount=ASKED)
    first = pending_provider_payment(order)
    payment_apply_charge(
        payment_id=first.pk, charge=answer(first, "SUCCESS", COLLECTED)
    )
    second = Payment.objects.create(
        order=order, method=Payment.Method.PROVIDER, amount=ASKED, currency="CNY"
    )
    charge = answer(first, "REFUNDED", COLLECTED)
    assert payment_apply_charge(payment_id=second.pk, charge=charge).status == "failed"
    assert not JournalEntry.objects.filter(
        reference__in=[provider_reference(second), refund_reference(second)]
    ).exists()
    assert_given_back_not_kept(first)


# -- over HTTP: beat's re-drive asks the simulator, racing itself and the callback --


@pytest.fixture
def callbacks(provider, settings):
    """The simulator delivers its callbacks to the app it runs in."""
    settings.PROVIDER_CALLBACK_URL = f"{provider}/api/v1/payments/callback"
    return provider


def stuck(api, order: Order) -> Payment:
    """The order's provider payment, opened through the API, pending past the
    re-drive's timeout."""

    started = provider_pending(api, order)
    age(Payment, started["id"], 3600)
    return Payment.objects.select_related("order").get(pk=started["id"])


def redrive_from_beat(payment: Payment) -> list:
    """Beat's run picks the payment; its task, and three more of it at once (a
    redelivery, the next rotation, the cancel task's answer), ask the provider."""

    assert payments_stuck(older_than_seconds=60) == [payment.pk]
    return run_in_threads(4, lambda i: payment_redrive_task(payment.pk))


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_redrives_of_a_charge_of_another_amount_give_it_back_once(callbacks):

    user, api, _ = customer("gus")
    payment = stuck(api, place_order(user, amount=ASKED))
    # The provider's page collects another amount than it was asked for.
    Charge.objects.filter(txn_id=payment.provider_txn_id).update(amount=COLLECTED)
    settle_at_provider(payment.pay_url, "confirm")
    outcomes = redrive_from_beat(payment)
    assert all(isinstance(o, str) for o in outcomes), outcomes
    assert_given_back_not_kept(payment)
    assert payments_stuck(older_than_seconds=60) == []  # asked no more
    assert len(ledger_report()["warnings"]) == 1
    # The refund's task has the provider give the money back to the payer.
    assert refund_return_at_provider_task(Refund.objects.get().pk) is True
    assert Charge.objects.get().status == Charge.Status.REFUNDED
    report = ledger_report()
    assert report["ok"] and not report["warnings"], report
    # The provider's callback, delivered at last, is acknowledged and moves nothing.
    assert notification_deliver(notification_id=Notification.objects.get().pk)
    provider_event_process(event_id=ProviderEvent.objects.get().pk)
    assert_given_back_not_kept(payment)


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_redrives_racing_the_callback_of_a_charge_refunded_since(callbacks):
    """Paid on the pay page, then refunded at the provider before its callback was
    applied: the stored callback and four re-drives at once end it refunded once."""

    user, api, _ = customer("hal")
    payment = stuck(api, place_order(user, amount=ASKED))
    settle_at_provider(payment.pay_url, "confirm")
    assert notification_deliver(notification_id=Notification.objects.get().pk)
    event = ProviderEvent.objects.get()  # stored; its task not run yet
    provider_charge_refund(merchant_order_no=payment.order.merchant_order_no)
    assert payments_stuck(older_than_seconds=60) == [payment.pk]

    def race(i: int) -> str:
        if i == 0:
            return provider_event_process(event_id=event.pk).status
        return payment_redrive_task(payment.pk)

    outcomes = run_in_threads(5, race)
    assert all(isinstance(o, str) for o in outcomes), outcomes
    assert_refunded_as_at_the_provider(payment)
    payment_redrive(payment_id=payment.pk)  # repeated: nothing more
    assert_refunded_as_at_the_provider(payment)
    assert payments_stuck(older_than_seconds=60) == []
    # The provider gave the money back: the refund is returned, not asked again.
    refund = Refund.objects.get()
    assert refund.at_provider == Refund.AtProvider.RETURNED
    assert refund.returned_at is not None
    assert refund_return_at_provider_task(refund.pk) is False
    assert Charge.objects.get().refunded_at is not None
    assert_refunded_as_at_the_provider(payment)


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_redrive_of_a_cancelled_orders_charge_refunded_since(callbacks):
    """The payer paid, the order was cancelled, the provider refunded the charge:
    the re-drive books the late success and gives it back, as its callback
    would have, instead of calling the payment cancelled."""

    user, api, _ = customer("ivy")
    order = place_order(user, amount=ASKED)
    payment = stuck(api, order)
    settle_at_provider(payment.pay_url, "confirm")
    order_cancel(order_id=order.pk)
    provider_charge_refund(merchant_order_no=order.merchant_order_no)
    redrive_from_beat(payment)
    after = state(payment)
    assert after["payment"] == (Payment.Status.REFUNDED, ASKED)
    assert after["order"] == Order.Status.CANCELLED
    assert after["refund"] == (ASKED, "order_cancelled")
    assert len(after["entries"]) == 2
    assert (after["merchant"], after["external"]) == (0, 0)
    assert payments_stuck(older_than_seconds=60) == []
    assert ledger_report()["ok"]
