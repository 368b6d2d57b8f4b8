"""Staff record a charge that `check_ledger` names as booked by no payment taken up
with the provider, and the warning stops naming it.

Provider events are never deleted, so a charge reported collected in an answer
about another charge (`tests/payments/test_unbooked_charges.py`) would be named
every ten minutes forever. Once an operator has taken it up with the provider
(refunded it there, settled it by hand), the admin's "Taken up with the provider",
on provider events and on payments, records who did and when, once per charge
however often and from however many browsers it is pressed; only staff allowed to
add such a record may.
"""

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection

from payments.models import ChargeTakenUp, Payment, ProviderEvent
from payments.services import payment_record_charge
from tests.backoffice import messages_of, staff
from tests.conftest import run_in_threads
from tests.helpers import customer, event_body, pending_provider_payment, place_order
from tests.payments.test_settle_other_charge import (
    AMOUNT,
    charge,
    opened_without_charge,
    process,
    stored,
)
from tests.payments.test_unbooked_charges import named, redriven

pytestmark = pytest.mark.django_db

PAYMENTS = "/admin/payments/payment/"
EVENTS = "/admin/payments/providerevent/"


def event_about_t1() -> ProviderEvent:
    """A success callback about T1, processed after the payment recorded T2: named
    by `check_ledger`."""
    user, _, _ = customer("ann")
    payment = opened_without_charge(place_order(user, amount=AMOUNT))
    other = stored(event_body(payment, provider_txn_id="T1"))
    payment_record_charge(
        payment_id=payment.pk, provider_txn_id="T2", pay_url="http://pay.example/p/2"
    )
    process(other)
    assert [w.split(" reported")[0] for w in named()] == [
        f"provider charge 'T1' (order {payment.order.merchant_order_no})"
    ]
    return other


def take_up(client, changelist: str, ids: list[int]):
    return client.post(
        changelist, {"action": "take_up", "_selected_action": ids}, follow=True
    )


def test_taken_up_from_its_event_the_charge_is_no_longer_named(
    admin_client, admin_user
):
    event = event_about_t1()
    response = take_up(admin_client, EVENTS, [event.pk])
    assert response.status_code == 200
    assert "Taken up with the provider (T1): 1 recorded." in messages_of(response)
    assert named() == []
    taken = ChargeTakenUp.objects.get()
    assert (taken.provider_txn_id, taken.taken_up_by) == ("T1", admin_user)
    assert taken.taken_up_at is not None


def test_taken_up_from_its_payment_the_charge_is_no_longer_named(
    admin_client, monkeypatch
):
    """A re-drive heard T1, not the payment's T2, collected: taken up from the
    payment's row (filter "answer about another charge")."""
    user, _, _ = customer("bea")
    payment = pending_provider_payment(place_order(user, amount=AMOUNT), txn="T2")
    redriven(payment, monkeypatch, charge(payment, "T1"))
    assert len(named()) == 1
    listed = admin_client.get(PAYMENTS, {"another_charge": "yes"}).content.decode()
    assert "take_up" in listed
    response = take_up(admin_client, PAYMENTS, [payment.pk])
    assert "Taken up with the provider (T1): 1 recorded." in messages_of(response)
    assert named() == []
    assert list(ChargeTakenUp.objects.values_list("provider_txn_id", flat=True)) == [
        "T1"
    ]


def test_pressed_twice_it_records_once(admin_client):
    event = event_about_t1()
    take_up(admin_client, EVENTS, [event.pk])
    first = ChargeTakenUp.objects.get()
    again = take_up(admin_client, EVENTS, [event.pk])
    assert "Taken up with the provider (T1): 1 recorded before." in messages_of(again)
    assert list(ChargeTakenUp.objects.all()) == [first]
    assert ChargeTakenUp.objects.get().taken_up_at == first.taken_up_at
    assert named() == []


def test_rows_about_no_collected_charge_record_nothing(admin_client, monkeypatch):
    """A payment that heard of no other charge, one that heard of another charge
    declined: nothing to take up, and the page says so."""
    user, _, _ = customer("cal")
    quiet = pending_provider_payment(place_order(user, amount=AMOUNT), txn="T3")
    declined = pending_provider_payment(place_order(user, amount=AMOUNT), txn="T4")
    redriven(declined, monkeypatch, charge(declined, "T7", "FAILED"))
    response = take_up(admin_client, PAYMENTS, [quiet.pk, declined.pk])
    assert (
        "None of the selected rows reports another charge collected; nothing was "
        "recorded." in messages_of(response)
    )
    assert not ChargeTakenUp.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_from_two_browsers_at_once_it_records_once(admin_user, on_postgres):
    """Four staff pages press it on the same charge at the same instant: one
    record, every other press told it was recorded before, none a 500."""
    event = event_about_t1()
    results = run_in_threads(
        4, lambda i: messages_of(take_up(staff(admin_user), EVENTS, [event.pk]))
    )
    shown = [m for messages in results for m in messages]
    assert sum(m.endswith(": 1 recorded.") for m in shown) == 1, shown
    assert sum(m.endswith(": 1 recorded before.") for m in shown) == 3, shown
    assert ChargeTakenUp.objects.count() == 1
    assert named() == []
    connection.close()


def test_staff_without_the_permission_and_customers_cannot(client):
    """Staff who may only look at events are not offered the action, and pressing
    it anyway records nothing; a customer is sent to the admin's login."""
    event = event_about_t1()
    viewer = User.objects.create_user("viewer", is_staff=True)
    viewer.user_permissions.add(
        Permission.objects.get(codename="view_providerevent"),
        Permission.objects.get(codename="view_payment"),
    )
    looker = staff(viewer)
    assert "take_up" not in looker.get(EVENTS).content.decode()
    assert take_up(looker, EVENTS, [event.pk]).status_code == 200
    payment = Payment.objects.get(pk=event.payment_id)
    assert take_up(looker, PAYMENTS, [payment.pk]).status_code == 200
    customer_user, _, _ = customer("dan")
    client.force_login(customer_user)
    refused = client.post(EVENTS, {"action": "take_up", "_selected_action": [event.pk]})
    assert refused.status_code == 302 and "/login/" in refused["Location"]
    assert not ChargeTakenUp.objects.exists()
    assert len(named()) == 1
    viewer.user_permissions.add(Permission.objects.get(codename="add_chargetakenup"))
    allowed = staff(User.objects.get(pk=viewer.pk))  # permissions read afresh
    response = take_up(allowed, EVENTS, [event.pk])
    assert "Taken up with the provider (T1): 1 recorded." in messages_of(response)
    assert ChargeTakenUp.objects.get().taken_up_by == viewer
    assert named() == []


def test_the_action_reads_in_chinese(admin_client):
    event_about_t1()
    page = admin_client.get(EVENTS, HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "已与支付机构处理" in page
