"""A provider pay request resumed after its order stopped taking money answers what
a fresh request would: `409 order_already_paid` or `409 order_not_payable`,
stored and replayed like any refusal, never a `201` with a pay page for a payment
that can no longer be paid. Nothing is charged or left open at the provider.

Over real HTTP: a gunicorn serves our API and the provider simulator; the pay
requests go through the API as a client sends them.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from idempotency.completer import complete_stuck
from idempotency.models import IdempotencyRecord
from orders.models import Order
from payments import services
from payments.models import Payment
from payments.provider.models import Charge
from payments.services import payment_redrive
from payments.tasks import payment_cancel_open_charges_task
from tests.conftest import Background, run_in_threads
from tests.helpers import (
    assert_ledger_ok,
    assert_problem,
    balance,
    customer,
    new_key,
    place_order,
)
from tests.payments.test_cancel import assert_paid_once_from_the_balance, pay
from tests.servers import free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def cut_off_after_phase_one(api, order: Order, settings) -> str:
    """A provider pay request whose provider call failed (`503`): its pending
    payment is committed, its key released at that recovery point. Its key."""
    key = new_key()
    live = settings.PAYMENT_PROVIDER_URL
    settings.PAYMENT_PROVIDER_URL = f"http://127.0.0.1:{free_port()}/provider"
    assert pay(api, order, "provider", key).status_code == 503
    settings.PAYMENT_PROVIDER_URL = live
    record = IdempotencyRecord.objects.get(key=key)
    assert (record.status, record.recovery_point) == ("processing", "payment_created")
    return key


def assert_refused_and_stored(api, order: Order, key: str, code: str) -> None:
    """The retry is refused with `code`, the refusal stored and replayed, and the
    provider never asked for a charge."""
    resumed = pay(api, order, "provider", key)
    body = assert_problem(resumed, 409, code)
    assert "pay_url" not in body
    record = IdempotencyRecord.objects.get(key=key)
    assert (record.status, record.response_status) == ("failed", 409)
    again = pay(api, order, "provider", key)
    assert again.status_code == 409
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == resumed.content
    assert not Charge.objects.exists()  # nothing opened at the provider


@pytest.mark.parametrize("cancel_ran", [True, False])
def test_a_resumed_pay_request_of_an_order_paid_meanwhile_is_refused(
    provider, settings, cancel_ran
):
    """The order was paid from the balance while the pay request stood between its
    steps; its open payment cancelled by the task the balance payment sent, or not
    yet (the task is late, or was left to beat)."""
    user, api, wallet = customer("ivy", balance=5000)
    order = place_order(user, amount=1500)
    key = cut_off_after_phase_one(api, order, settings)
    assert pay(api, order, "balance").status_code == 201
    if cancel_ran:
        assert payment_cancel_open_charges_task(order.pk) == 1  # no charge yet
        assert Payment.objects.get(method="provider").status == "cancelled"

    assert_refused_and_stored(api, order, key, "order_already_paid")
    # The task, whenever it runs, closes the payment; the provider has no charge.
    payment_cancel_open_charges_task(order.pk)
    assert Payment.objects.get(method="provider").status == "cancelled"
    assert not Charge.objects.exists()
    assert_paid_once_from_the_balance(order, wallet, 5000)


def test_a_resumed_pay_request_of_an_order_cancelled_meanwhile_is_refused(
    provider, settings
):
    user, api, wallet = customer("jon", balance=5000)
    order = place_order(user, amount=1600)
    key = cut_off_after_phase_one(api, order, settings)
    cancelled = api.post(
        f"/api/v1/orders/{order.merchant_order_no}/cancel",
        headers={"Idempotency-Key": new_key()},
    )
    assert cancelled.status_code == 200, cancelled.content
    assert payment_cancel_open_charges_task(order.pk) == 1

    assert_refused_and_stored(api, order, key, "order_not_payable")
    order.refresh_from_db()
    assert order.status == Order.Status.CANCELLED
    assert balance(wallet) == 5000
    assert_ledger_ok()


def test_a_charge_opened_after_the_cancel_is_refused_and_cancelled(
    provider, monkeypatch
):
    """The race after the last check: the order is paid from the balance, and its
    cancel finds no charge, while the pay request asks the provider for one. The
    request records the charge on its cancelled payment, which sends the cancel
    again, and answers the refusal, not the charge's pay page."""
    user, api, wallet = customer("kim", balance=5000)
    order = place_order(user, amount=1700)
    charge_create = services.provider_charge_create

    def paid_meanwhile(**kwargs):
        def pay_from_the_balance() -> None:
            assert pay(customer("kim")[1], order, "balance").status_code == 201
            assert payment_cancel_open_charges_task(order.pk) == 1  # no charge yet

        meanwhile = Background(pay_from_the_balance)
        meanwhile.start()
        assert meanwhile.outcome() is None
        return charge_create(**kwargs)

    monkeypatch.setattr(services, "provider_charge_create", paid_meanwhile)
    key = new_key()
    refused = pay(api, order, "provider", key)
    assert_problem(refused, 409, "order_already_paid")
    payment = Payment.objects.get(method="provider")
    assert payment.status == Payment.Status.CANCELLED and payment.provider_txn_id
    assert Charge.objects.get().status == Charge.Status.PENDING
    payment_cancel_open_charges_task(order.pk)  # what the record's commit sent
    assert Charge.objects.get().status == Charge.Status.CANCELLED
    again = pay(api, order, "provider", key)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == refused.content
    assert_paid_once_from_the_balance(order, wallet, 5000)


def test_beat_completes_the_request_with_the_refusal(provider, settings):
    """The client never came back: beat's completer resumes its key, finds the
    order paid, asks the provider nothing and stores the refusal, which the
    client's retry, back at last, gets replayed."""
    user, api, wallet = customer("lea", balance=5000)
    order = place_order(user, amount=1800)
    key = cut_off_after_phase_one(api, order, settings)
    assert pay(api, order, "balance").status_code == 201
    assert complete_stuck() == 1
    assert complete_stuck() == 0
    record = IdempotencyRecord.objects.get(key=key)
    assert (record.status, record.response_status) == ("failed", 409)
    assert not Charge.objects.exists()
    again = pay(api, order, "provider", key)
    assert_problem(again, 409, "order_already_paid")
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == bytes(record.response_body)
    assert_paid_once_from_the_balance(order, wallet, 5000)


def test_a_resumed_pay_request_racing_the_balance_payment_ends_one_way(
    provider, settings
):
    """The retry and a balance payment at the same instant: the retry either got
    the order first (`201`, its charge then cancelled) or is refused; never a
    `201` with a payment that can no longer be paid, and the provider ends with no
    open charge."""
    user, api, wallet = customer("max", balance=5000)
    order = place_order(user, amount=1900)
    key = cut_off_after_phase_one(api, order, settings)

    def work(i: int):
        client = customer("max")[1]
        if i == 0:
            return pay(client, order, "provider", key)
        return pay(client, order, "balance")

    retried, paid = run_in_threads(2, work)
    assert paid.status_code == 201, paid.content
    if retried.status_code == 201:
        assert retried.json()["status"] == "pending", retried.content
    else:
        assert_problem(retried, 409, "order_already_paid")
    payment_cancel_open_charges_task(order.pk)  # what the balance payment sent
    assert Payment.objects.get(method="provider").status == "cancelled"
    assert set(Charge.objects.values_list("status", flat=True)) <= {"CANCELLED"}
    assert_paid_once_from_the_balance(order, wallet, 5000)


def test_a_resumed_pay_request_whose_payment_failed_meanwhile_pays_anew(
    provider, settings
):
    """The order still takes money, but beat's re-drive failed the payment while
    the request stood between its steps (the provider had no charge): the retry
    opens the order's payment again, as a fresh request would, and answers its pay
    page, not the failed payment's."""
    user, api, _ = customer("ned", balance=0)
    order = place_order(user, amount=1250)
    key = cut_off_after_phase_one(api, order, settings)
    failed = Payment.objects.get(method="provider")
    Payment.objects.filter(pk=failed.pk).update(
        created_at=timezone.now() - timedelta(hours=1)
    )
    assert payment_redrive(payment_id=failed.pk).status == Payment.Status.FAILED

    resumed = pay(api, order, "provider", key)
    assert resumed.status_code == 201, resumed.content
    body = resumed.json()
    assert body["id"] != failed.pk
    assert body["status"] == "pending" and body["pay_url"]
    assert Charge.objects.get().txn_id == body["provider_txn_id"]
    failed.refresh_from_db()
    assert (failed.status, failed.pay_url) == (Payment.Status.FAILED, "")
    again = pay(api, order, "provider", key)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == resumed.content
    assert_ledger_ok()


def test_two_completers_and_the_clients_retry_at_once_finish_it_once(
    provider, settings
):
    """Beat's completer delivered twice (a redelivered task, two beats during a
    failover) runs while the client's retry arrives: one of them takes the key over
    and finishes the request with the provider's one charge; the others leave it,
    and the client gets the pay page, now or on its next retry."""
    user, api, _ = customer("mia", balance=0)
    order = place_order(user, amount=1900)
    key = cut_off_after_phase_one(api, order, settings)

    def work(i: int):
        if i < 2:
            return complete_stuck()
        answer = pay(customer("mia")[1], order, "provider", key)
        return answer.status_code, answer.json()

    first, second, retried = run_in_threads(3, work)
    assert first + second <= 1, (first, second, retried)
    status, body = retried
    assert status in (201, 409), retried
    if status == 409:  # a completer had it: the retry is told to come back
        assert body["code"] == "idempotency_key_in_flight", body
    if first + second == 0:  # the client took it over
        assert status == 201
    charge = Charge.objects.get()
    payment = Payment.objects.get(order=order)
    assert (payment.provider_txn_id, payment.status) == (charge.txn_id, "pending")
    record = IdempotencyRecord.objects.get(key=key)
    assert (record.status, record.response_status) == ("succeeded", 201)
    again = pay(api, order, "provider", key)
    assert again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["pay_url"] == payment.pay_url
