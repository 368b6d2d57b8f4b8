"""Beat's reconciliation finds a charge refunded at the provider after its success
callback settled the payment, and refunds it here, once.

The provider's callbacks report a success or a failure, never a refund made at the
provider (its dashboard, a chargeback): without asking, the payment stayed
`succeeded`, the order `paid` and shipped, the money counted as the merchant's.
Beat asks the provider about provider payments settled lately, in batches of the
least recently asked, through `payment_redrive` (the re-drive's REFUNDED answer:
refunded here with the refund recorded returned, the provider not asked again).

The batches run on any database; the rest ask the simulator over real HTTP, on
PostgreSQL, racing themselves and the customer's own refund.
"""

import threading
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from ledger.invariants import ledger_report
from ledger.models import JournalEntry
from payments.checks import RECONCILE_SETTINGS, reconcile_settings_positive
from payments.models import Payment, ProviderEvent, Refund
from payments.provider.models import Charge
from payments.provider.services import charge_refund
from payments.services import (
    REFUNDED_AT_PROVIDER,
    payments_to_reconcile,
    refund_reference,
)
from payments.tasks import (
    payment_redrive_task,
    reconcile_settled_payments,
    redrive_pending_payments,
    refund_return_at_provider_task,
)
from tests.conftest import Background, run_in_threads
from tests.helpers import (
    assert_problem,
    customer,
    event_body,
    new_key,
    place_order,
    post_callback,
)
from tests.payments.test_provider_refunds import paid_through_the_provider
from tests.payments.test_redrive_outcomes import (
    ASKED,
    assert_refunded_as_at_the_provider,
)

HOUR = 3600
WINDOW = 30 * 86400


def settled(user, *, days_ago: float = 0, method: str = "provider") -> int:
    """A payment of a new order of `user`'s, succeeded `days_ago` days ago."""
    order = place_order(user)
    payment = Payment.objects.create(
        order=order,
        method=method,
        amount=order.amount,
        currency="CNY",
        status=Payment.Status.SUCCEEDED,
    )
    Payment.objects.filter(pk=payment.pk).update(
        succeeded_at=timezone.now() - timedelta(days=days_ago)
    )
    return payment.pk


def to_reconcile(limit: int = 100) -> list[int]:
    return payments_to_reconcile(
        settled_within_seconds=WINDOW, asked_every_seconds=HOUR, limit=limit
    )


def asked_ago(payment_id: int, seconds: int) -> None:
    Payment.objects.filter(pk=payment_id).update(
        provider_asked_at=timezone.now() - timedelta(seconds=seconds)
    )


# -- the batches --


@pytest.mark.django_db
def test_only_provider_payments_settled_within_the_window_are_asked():
    user, _, _ = customer("una")
    recent = settled(user, days_ago=1)
    settled(user, days_ago=31)  # past the window
    settled(user, method="balance")  # no provider to ask
    pending = Payment.objects.create(
        order=place_order(user), method="provider", amount=1000, currency="CNY"
    )
    asked_ago(pending.pk, 2 * HOUR)
    assert to_reconcile() == [recent]


@pytest.mark.django_db
def test_each_settled_payment_is_asked_in_its_turn_once_an_interval():
    """Bounded batches, the least recently asked first; one asked within the
    interval waits for it to pass."""
    user, _, _ = customer("vic")
    made = [settled(user) for _ in range(5)]
    assert [to_reconcile(limit=2) for _ in range(4)] == [
        made[0:2],
        made[2:4],
        made[4:5],
        [],
    ]
    asked_ago(made[3], HOUR + 60)
    asked_ago(made[1], HOUR + 120)
    assert to_reconcile(limit=2) == [made[1], made[3]]
    (newest,) = [settled(user)]  # never asked: first of all
    asked_ago(made[0], HOUR + 60)
    assert to_reconcile(limit=2) == [newest, made[0]]


@pytest.mark.django_db
def test_a_parked_payment_takes_no_place_in_a_batch():
    """A settled payment whose re-drive was parked (its refund refused by a frozen
    merchant account) waits for staff: a batch leaves it out, as the re-drive of
    stuck payments does, instead of spending a place and a task on it each
    interval."""
    user, _, _ = customer("tia")
    parked, free = settled(user), settled(user)
    Payment.objects.filter(pk=parked).update(
        redrive_parked_at=timezone.now(), redrive_attempts=10
    )
    assert to_reconcile(limit=1) == [free]
    assert to_reconcile() == []
    assert Payment.objects.get(pk=parked).provider_asked_at is None


@pytest.mark.django_db(transaction=True)
def test_a_narrowed_window_retires_its_payments_a_batch_a_commit(monkeypatch):
    """A run that moves many payments out of a window made narrower commits each
    batch: a run that dies midway keeps the batches it finished, and a refund of
    one of them waited for its batch only, not for the whole run."""
    import payments.services as services

    user, _, _ = customer("uma")
    old = [settled(user, days_ago=10) for _ in range(5)]
    monkeypatch.setattr(services, "RETIRE_BATCH", 2)
    real_update, updates = services.QuerySet.update, []

    def dies_at_the_third_batch(queryset, **values):
        if values == {"reconcile_retired": True}:
            updates.append(values)
            if len(updates) == 3:
                raise RuntimeError("the run died")
        return real_update(queryset, **values)

    monkeypatch.setattr(services.QuerySet, "update", dies_at_the_third_batch)
    with pytest.raises(RuntimeError):
        payments_to_reconcile(
            settled_within_seconds=86400, asked_every_seconds=HOUR, limit=10
        )
    retired = Payment.objects.filter(pk__in=old, reconcile_retired=True)
    assert retired.count() == 4  # two batches of two committed
    monkeypatch.undo()
    assert to_reconcile() == old  # the wider window takes them all in again


@pytest.mark.django_db(transaction=True)
def test_two_runs_at_once_share_the_batch(on_postgres):
    """Beats overlapping on a slow database: each payment is asked by one run."""
    user, _, _ = customer("wes")
    made = [settled(user) for _ in range(4)]
    taken, go_on = threading.Event(), threading.Event()

    def first_run() -> list[int]:
        with transaction.atomic():
            ids = to_reconcile(limit=2)
            taken.set()
            assert go_on.wait(30)
        return ids

    first = Background(first_run)
    first.start()
    assert taken.wait(30)
    second = to_reconcile()
    go_on.set()
    assert first.outcome() == made[:2]
    assert second == made[2:]


# -- over HTTP: the simulator refunds a charge our callback settled --


@pytest.fixture
def callbacks(provider, settings):
    settings.PROVIDER_CALLBACK_URL = f"{provider}/api/v1/payments/callback"
    return provider


def paid_then_refunded_at_the_provider(username: str) -> tuple:
    """An order paid on the pay page, settled by its callback, then refunded at
    the provider by someone else than us (its dashboard): (API client, payment,
    charge)."""
    user, api, _ = customer(username)
    started, charge = paid_through_the_provider(api, user, ASKED)
    payment = Payment.objects.select_related("order").get(pk=started["id"])
    charge_refund(merchant_order_no=charge.merchant_order_no)
    charge.refresh_from_db()
    assert charge.status == Charge.Status.REFUNDED
    return api, payment, charge


def refunded_once_at_the_provider(payment: Payment, charge: Charge) -> None:
    refunded_at = charge.refunded_at
    charge.refresh_from_db()
    assert charge.status == Charge.Status.REFUNDED
    assert charge.refunded_at == refunded_at  # the provider gave it back once
    assert JournalEntry.objects.filter(reference=refund_reference(payment)).count() == 1
    report = ledger_report()
    assert report["ok"] and not report["warnings"], report


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_charge_refunded_at_the_provider_is_refunded_here(callbacks):
    _, payment, charge = paid_then_refunded_at_the_provider("xia")
    assert redrive_pending_payments() == 0  # it asks about pending payments only
    assert reconcile_settled_payments() == 1
    assert payment_redrive_task(payment.pk) == Payment.Status.REFUNDED
    assert_refunded_as_at_the_provider(payment)
    refunded_once_at_the_provider(payment, charge)
    # Refunded: never asked about again, and its refund asks the provider nothing.
    asked_ago(payment.pk, HOUR + 60)
    assert reconcile_settled_payments() == 0
    assert refund_return_at_provider_task(Refund.objects.get().pk) is False


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_charge_still_paid_at_the_provider_changes_nothing(callbacks):
    user, api, _ = customer("yan")
    started, _charge = paid_through_the_provider(api, user, ASKED)
    assert reconcile_settled_payments() == 1
    assert payment_redrive_task(started["id"]) == Payment.Status.SUCCEEDED
    assert not Refund.objects.exists()
    assert reconcile_settled_payments() == 0  # asked within the interval


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_asked_twice_and_raced_by_the_customers_refund_refunds_once(callbacks):
    """Two runs at once, their task delivered four times at once, the success
    callback delivered again and the customer asking for a refund, all together:
    one refund, the money out once, the provider's refund not asked for again."""
    api, payment, charge = paid_then_refunded_at_the_provider("zed")

    def race(i: int):
        if i < 2:
            return reconcile_settled_payments()
        if i < 6:
            return payment_redrive_task(payment.pk)
        if i == 6:
            again = post_callback(
                {**ProviderEvent.objects.get().payload}, url=callbacks
            )
            return again.status_code
        return api.post(
            f"/api/v1/payments/{payment.pk}/refund",
            {"reason": "damaged"},
            format="json",
            headers={"Idempotency-Key": new_key()},
        ).status_code

    outcomes = run_in_threads(8, race)
    # Never both: two runs share the work. Neither, when the customer's refund
    # held the payment's row as they looked (they skip the rows another holds);
    # the tasks then bring it to the provider's answer all the same.
    assert sorted(outcomes[:2]) in ([0, 0], [0, 1]), outcomes
    assert all(isinstance(o, str) for o in outcomes[2:6]), outcomes
    assert outcomes[6] == 200, outcomes
    (made,) = Refund.objects.all()
    if made.reason == REFUNDED_AT_PROVIDER:  # beat's came first
        assert outcomes[7] == 409, outcomes
        assert refund_return_at_provider_task(made.pk) is False  # not asked
    else:  # the customer's came first: the provider answers it is refunded
        assert outcomes[7] == 201, outcomes
        assert refund_return_at_provider_task(made.pk) is True
    made.refresh_from_db()
    assert made.at_provider == Refund.AtProvider.RETURNED
    payment.refresh_from_db()
    assert payment.status == Payment.Status.REFUNDED
    refunded_once_at_the_provider(payment, charge)
    assert payment_redrive_task(payment.pk) == Payment.Status.REFUNDED


class Killed(BaseException):
    """The process dies here (not an error any code would catch)."""


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_task_killed_mid_refund_is_redone_once(callbacks, monkeypatch):
    """Killed after the refund's entry and row were written, before its commit:
    nothing of it stays, and the task delivered again refunds once."""
    _, payment, charge = paid_then_refunded_at_the_provider("abe")
    assert reconcile_settled_payments() == 1

    def die(**kwargs):
        raise Killed()

    with monkeypatch.context() as patched:
        patched.setattr("payments.services.order_mark_refunded", die)
        with pytest.raises(Killed):
            payment_redrive_task(payment.pk)
    payment.refresh_from_db()
    assert payment.status == Payment.Status.SUCCEEDED
    assert not Refund.objects.exists()
    assert not JournalEntry.objects.filter(reference=refund_reference(payment))
    # acks_late: the broker delivers the task again.
    assert payment_redrive_task(payment.pk) == Payment.Status.REFUNDED
    assert payment_redrive_task(payment.pk) == Payment.Status.REFUNDED
    assert_refunded_as_at_the_provider(payment)
    refunded_once_at_the_provider(payment, charge)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_run_that_died_before_sending_its_tasks_is_finished_later(callbacks):
    """The batch committed its stamps and the process died before sending the
    tasks: the payment is asked again once the interval has passed."""
    _, payment, charge = paid_then_refunded_at_the_provider("bo")
    assert to_reconcile() == [payment.pk]  # its tasks never sent
    assert reconcile_settled_payments() == 0  # asked within the interval
    asked_ago(payment.pk, HOUR + 60)
    assert reconcile_settled_payments() == 1
    payment_redrive_task(payment.pk)
    assert_refunded_as_at_the_provider(payment)
    refunded_once_at_the_provider(payment, charge)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_no_callback_reports_a_refund(callbacks):
    """The callback's `status` is SUCCESS or FAILED: a refund announced there,
    signed or not, is refused with nothing changed; asking is the only way."""
    user, api, _ = customer("cal")
    started, _charge = paid_through_the_provider(api, user, ASKED)
    payment = Payment.objects.select_related("order").get(pk=started["id"])
    events = ProviderEvent.objects.count()
    body = event_body(payment, status="REFUNDED")
    assert_problem(post_callback(body, url=callbacks), 400, "validation_error")
    assert_problem(
        post_callback(body, url=callbacks, header=""),
        401,
        "callback_signature_invalid",
    )
    assert ProviderEvent.objects.count() == events
    payment.refresh_from_db()
    assert payment.status == Payment.Status.SUCCEEDED
    assert not Refund.objects.exists()


def test_beat_reconciles_every_minute(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["payments-reconcile-settled"]
    assert entry == {
        "task": "payments.tasks.reconcile_settled_payments",
        "schedule": 60.0,
    }


@pytest.mark.parametrize("name", RECONCILE_SETTINGS)
def test_a_reconciliation_setting_of_zero_is_refused_at_start_up(settings, name):
    assert reconcile_settings_positive() == []
    setattr(settings, name, 0)
    (error,) = reconcile_settings_positive()
    assert error.id == "payments.E002" and name in error.msg
