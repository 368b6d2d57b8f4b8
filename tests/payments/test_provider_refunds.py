"""A refunded provider payment's money goes back to the payer through the provider.

The refund commits in our ledger (merchant -> external) with the refund `pending` at
the provider; a task then asks the provider to refund the charge, outside any
transaction, and marks the refund `returned`. The provider refunds a charge once
however often it is asked, so the task is safe to repeat: redelivered, raced,
killed between the provider's answer and our mark, or sent again by beat.

Over real HTTP: a gunicorn serves our API and the provider simulator; the task runs
in process, or in a real Celery worker where the test says so.
"""

from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from ledger.invariants import ledger_report
from ledger.services import external_account, merchant_account
from orders.services import order_cancel
from payments.exceptions import ProviderUnavailable
from payments.models import Payment, ProviderEvent, Refund
from payments.provider.models import Charge, Notification
from payments.provider.services import notification_deliver
from payments.provider_client import provider_charge_refund
from payments.services import provider_event_process, refunds_to_return
from payments.tasks import redrive_inbox, refund_return_at_provider_task
from tests.conftest import run_in_threads
from tests.helpers import balance, customer, new_key, place_order, wait_for
from tests.payments.test_cancel import PayPage, pay, provider_pending
from tests.servers import free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def paid_through_the_provider(api, user, amount: int) -> tuple[dict, Charge]:
    """An order paid on the provider's pay page, its callback delivered and
    applied: (the payment as the API showed it, the provider's charge)."""
    started = provider_pending(api, place_order(user, amount=amount))
    assert PayPage(started["pay_url"]).confirm().status_code == 303
    assert notification_deliver(notification_id=Notification.objects.latest("pk").pk)
    provider_event_process(event_id=ProviderEvent.objects.latest("pk").pk)
    assert Payment.objects.get(pk=started["id"]).status == Payment.Status.SUCCEEDED
    return started, Charge.objects.get(txn_id=started["provider_txn_id"])


def refund(api, payment_id: int) -> Refund:
    response = api.post(
        f"/api/v1/payments/{payment_id}/refund",
        {"reason": "damaged"},
        format="json",
        headers={"Idempotency-Key": new_key()},
    )
    assert response.status_code == 201, response.content
    return Refund.objects.get(payment_id=payment_id)


@pytest.fixture
def callbacks(provider, settings):
    settings.PROVIDER_CALLBACK_URL = f"{provider}/api/v1/payments/callback"
    return provider


def assert_returned_once(made: Refund, charge: Charge) -> None:
    made.refresh_from_db()
    charge.refresh_from_db()
    assert made.at_provider == Refund.AtProvider.RETURNED and made.returned_at
    assert charge.status == Charge.Status.REFUNDED and charge.refunded_at
    assert balance(merchant_account(currency="CNY")) == 0
    assert balance(external_account(currency="CNY")) == 0  # in, then out again
    report = ledger_report()
    assert report["ok"], report
    assert not report["warnings"], report


def test_a_refund_is_returned_by_the_provider_through_the_worker(worker, callbacks):
    """As `make run` does it: the refund's commit sends the task, the Celery worker
    asks the provider, the pay page then says the money is back."""
    user, api, _ = customer("ada")
    started, charge = paid_through_the_provider(api, user, 1800)
    made = refund(api, started["id"])
    assert made.at_provider in (Refund.AtProvider.PENDING, Refund.AtProvider.RETURNED)
    wait_for(
        lambda: Refund.objects.get(pk=made.pk).at_provider == "returned",
        what="the provider to return the refund",
    )
    assert_returned_once(made, charge)
    assert "the money is back with you" in httpx.get(started["pay_url"]).text


def test_the_task_asked_again_returns_the_money_once(callbacks):
    """Redelivered, raced by six at once, or killed after the provider refunded
    and before our mark: the charge is refunded once, the refund marked once."""
    user, api, _ = customer("bea")
    started, charge = paid_through_the_provider(api, user, 900)
    made = refund(api, started["id"])
    assert made.at_provider == Refund.AtProvider.PENDING
    # The task's first run dies after the provider's answer, before our mark.
    provider_charge_refund(merchant_order_no=charge.merchant_order_no)
    charge.refresh_from_db()
    refunded_at = charge.refunded_at
    marks = run_in_threads(6, lambda i: refund_return_at_provider_task(made.pk))
    assert sorted(marks) == [False] * 5 + [True], marks
    assert refund_return_at_provider_task(made.pk) is False  # a redelivery
    assert_returned_once(made, charge)
    assert charge.refunded_at == refunded_at  # the provider refunded it once


def test_the_task_retries_while_the_provider_is_down_and_beat_sends_it_again(
    callbacks, settings
):
    user, api, _ = customer("cy")
    started, charge = paid_through_the_provider(api, user, 700)
    live = settings.PAYMENT_PROVIDER_URL
    settings.PAYMENT_PROVIDER_URL = f"http://127.0.0.1:{free_port()}/provider"
    made = refund(api, started["id"])
    with pytest.raises(ProviderUnavailable):
        refund_return_at_provider_task(made.pk)
    assert issubclass(ProviderUnavailable, refund_return_at_provider_task.autoretry_for)
    charge.refresh_from_db()
    assert charge.status == Charge.Status.SUCCESS
    # Its task lost: beat's inbox re-drive sends it again a minute later.
    Refund.objects.filter(pk=made.pk).update(
        created_at=timezone.now() - timedelta(minutes=2)
    )
    assert refunds_to_return(older_than_seconds=60) == [made.pk]
    settings.PAYMENT_PROVIDER_URL = live
    assert redrive_inbox() >= 1
    refund_return_at_provider_task(made.pk)  # what the re-drive sent
    assert refunds_to_return(older_than_seconds=60) == []
    assert_returned_once(made, charge)


def test_a_late_success_for_a_cancelled_order_goes_back_to_the_payer(callbacks):
    """The payer confirmed a cancelled order's charge before the cancel reached the
    provider: the success is refunded at once, and returned at the provider."""
    user, api, _ = customer("dee")
    order = place_order(user, amount=1100)
    started = provider_pending(api, order)
    tab = PayPage(started["pay_url"])
    order_cancel(order_id=order.pk)  # its cancel task never ran
    assert tab.confirm().status_code == 303
    assert notification_deliver(notification_id=Notification.objects.get().pk)
    provider_event_process(event_id=ProviderEvent.objects.get().pk)
    made = Refund.objects.get(payment_id=started["id"])
    assert made.reason == "order_cancelled"
    assert refund_return_at_provider_task(made.pk) is True
    assert_returned_once(made, Charge.objects.get())


def test_a_refund_the_provider_refuses_is_named_for_an_operator(callbacks):
    """A charge the provider never collected cannot be refunded there: the refund
    is marked refused (asking again would not change the answer) and `check_ledger`
    names it, without failing. One the provider has not answered for ten minutes
    is named too."""
    user, api, _ = customer("eve")
    started, charge = paid_through_the_provider(api, user, 500)
    Charge.objects.filter(pk=charge.pk).update(status=Charge.Status.FAILED)
    made = refund(api, started["id"])
    assert refund_return_at_provider_task(made.pk) is False
    made.refresh_from_db()
    assert made.at_provider == Refund.AtProvider.REFUSED
    assert refunds_to_return(older_than_seconds=0) == []  # not sent again
    report = ledger_report()
    assert report["ok"]
    assert report["warnings"] == [f"refund {made.pk} refused by the provider"]
    Refund.objects.filter(pk=made.pk).update(
        at_provider=Refund.AtProvider.PENDING,
        created_at=timezone.now() - timedelta(minutes=11),
    )
    assert ledger_report()["warnings"] == [
        f"refund {made.pk} not yet returned by the provider"
    ]


def test_a_wallet_payment_refund_asks_no_provider(callbacks):
    user, api, wallet = customer("fred", balance=3000)
    paid = pay(api, place_order(user, amount=1000), "balance")
    assert paid.status_code == 201, paid.content
    made = refund(api, paid.json()["id"])
    assert made.at_provider == Refund.AtProvider.NONE
    assert refund_return_at_provider_task(made.pk) is False
    assert balance(wallet) == 3000
    assert not Charge.objects.exists()
