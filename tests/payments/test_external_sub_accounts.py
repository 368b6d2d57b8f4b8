"""The outside world's side of provider payments, spread like the merchant's
(`MERCHANT_SUB_ACCOUNTS`): settlements that hash to different sub-accounts do not
queue on one `external` row."""

import threading
import zlib

import pytest
from django.db import transaction

from ledger.exceptions import AccountNotActive
from ledger.invariants import ledger_report
from ledger.models import Account, JournalEntry
from ledger.services import (
    account_freeze,
    account_unfreeze,
    external_account,
    external_provider_account,
    merchant_account,
)
from ledger.tasks import sweep_merchant_sub_accounts
from orders.models import Order
from orders.services import order_cancel
from payments.models import Payment, Refund
from payments.services import payment_refund, payment_settle
from tests.conftest import Background, run_in_threads
from tests.helpers import (
    assert_ledger_ok,
    balance,
    blocked_on_lock,
    customer,
    pending_provider_payment,
    place_order,
    wait_for,
)

pytestmark = pytest.mark.django_db

SUBS = 4


@pytest.fixture(autouse=True)
def _spread(settings):
    settings.MERCHANT_SUB_ACCOUNTS = SUBS


def sub_number(payment: Payment) -> int:
    return zlib.crc32(f"provider:{payment.pk}".encode()) % SUBS


def provider_payments(user, count: int, amount: int = 300) -> list[Payment]:
    """`count` pending provider payments whose settlements hash to different
    sub-accounts."""
    found: dict[int, Payment] = {}
    while len(found) < count:
        payment = pending_provider_payment(place_order(user, amount=amount))
        found.setdefault(sub_number(payment), payment)
    return list(found.values())


@pytest.mark.django_db(transaction=True)
def test_settlements_on_two_sub_accounts_do_not_queue_on_the_outside(on_postgres):
    """One settlement holds its transaction open; another, hashed to another
    sub-account, goes through meanwhile instead of waiting for the first one's
    `external` row."""
    user, _, _ = customer("outside")
    first, second = provider_payments(user, 2)
    merchant_account(currency="CNY"), external_account(currency="CNY")  # in use
    settled, go = threading.Event(), threading.Event()

    def settle_held_open() -> str:
        with transaction.atomic(durable=True):
            status = payment_settle(
                payment_id=first.pk, provider_txn_id=first.provider_txn_id
            ).status
            settled.set()
            assert go.wait(30)
        return status

    holder = Background(settle_held_open)
    holder.start()
    assert settled.wait(30)

    def settle_second() -> str:
        with transaction.atomic(durable=True):
            return payment_settle(
                payment_id=second.pk, provider_txn_id=second.provider_txn_id
            ).status

    other = Background(settle_second)
    other.start()
    try:
        wait_for(
            lambda: not other.is_alive() or blocked_on_lock(Account),
            30,
            "the second settlement to finish or wait",
        )
        assert not other.is_alive(), "the second settlement waits for the first"
    finally:
        go.set()
    assert (holder.outcome(), other.outcome()) == (Payment.Status.SUCCEEDED,) * 2
    assert Order.objects.filter(status=Order.Status.PAID).count() == 2
    assert_ledger_ok()


def outside_subs() -> list[Account]:
    subs = Account.objects.filter(parent__isnull=False, kind=Account.Kind.EXTERNAL)
    return list(subs.order_by("pk"))


def settle(payment: Payment) -> Payment:
    return payment_settle(
        payment_id=payment.pk, provider_txn_id=payment.provider_txn_id
    )


def debited(payment: Payment) -> int:
    """The account the payment's settlement took the money from."""
    entry = Payment.objects.get(pk=payment.pk).journal_entry
    return entry.postings.get(amount__lt=0).account_id


def test_settlements_spread_over_the_outside_s_sub_accounts_and_are_swept_up():
    user, _, _ = customer("spread-outside")
    made = provider_payments(user, SUBS)
    for payment in made:
        settle(payment)
    world = external_account(currency="CNY")
    subs = outside_subs()
    assert len(subs) == SUBS
    assert {(s.kind, s.parent_id, s.currency) for s in subs} == {
        (Account.Kind.EXTERNAL, world.pk, "CNY")
    }
    assert {s.code for s in subs} == {f"external-cny-sub-{n}" for n in range(SUBS)}
    assert [balance(s) for s in subs] == [-300] * SUBS and balance(world) == 0
    for payment in made:  # each settlement took from the sub-account it hashes to
        chosen = external_provider_account(
            currency="CNY", spread_by=f"provider:{payment.pk}"
        )
        assert debited(payment) == chosen.pk
    report = assert_ledger_ok()
    assert report["money_inside"] == {"CNY": SUBS * 300}
    # The sweep moves both families up; a second one finds nothing to move.
    assert sweep_merchant_sub_accounts() == 2 * SUBS
    assert balance(world) == -SUBS * 300
    assert [balance(s) for s in outside_subs()] == [0] * SUBS
    assert sweep_merchant_sub_accounts() == 0
    assert_ledger_ok()


def test_a_refund_goes_back_out_to_the_sub_account_the_money_came_from():
    user, _, _ = customer("refund-outside")
    first, second = provider_payments(user, 2)
    settle(first), settle(second)
    sweep_merchant_sub_accounts()  # the outside sub-accounts at 0
    refund = payment_refund(payment_id=first.pk)
    credited = refund.journal_entry.postings.get(amount__gt=0).account_id
    assert credited == debited(first)
    assert balance(Account.objects.get(pk=credited)) == 300  # above zero, for now
    assert_ledger_ok()
    assert sweep_merchant_sub_accounts() == 1  # that one, back down into the parent
    assert balance(external_account(currency="CNY")) == -300
    assert_ledger_ok()


def test_a_late_success_goes_back_out_in_the_same_transaction_from_the_same_rows():
    user, _, _ = customer("late-outside")
    order = place_order(user, amount=800)
    payment = pending_provider_payment(order)
    order_cancel(order_id=order.pk)
    assert settle(payment).status == Payment.Status.REFUNDED
    (sub,) = outside_subs()
    refund = Refund.objects.get(payment=payment).journal_entry.postings
    assert refund.get(amount__gt=0).account_id == debited(payment) == sub.pk
    assert balance(sub) == 0
    assert_ledger_ok()


def test_a_replayed_settlement_books_once():
    user, _, _ = customer("replay-outside")
    (payment,) = provider_payments(user, 1)
    settle(payment), settle(payment)
    assert JournalEntry.objects.filter(reference=f"provider:{payment.pk}").count() == 1
    assert sum(balance(s) for s in outside_subs()) == -300
    assert_ledger_ok()


@pytest.mark.django_db(transaction=True)
def test_concurrent_settlements_of_one_payment_book_once(on_postgres):
    user, _, _ = customer("race-outside")
    (payment,) = provider_payments(user, 1)

    def work(i: int) -> str:
        with transaction.atomic(durable=True):
            return settle(payment).status

    assert run_in_threads(4, work) == [Payment.Status.SUCCEEDED] * 4
    assert JournalEntry.objects.filter(reference=f"provider:{payment.pk}").count() == 1
    assert sum(balance(s) for s in outside_subs()) == -300
    assert_ledger_ok()


def test_without_the_setting_settlements_debit_the_outside_itself(settings):
    settings.MERCHANT_SUB_ACCOUNTS = 0
    user, _, _ = customer("one-outside")
    (payment,) = provider_payments(user, 1)
    settle(payment)
    payment_refund(payment_id=payment.pk)
    assert outside_subs() == []
    world = external_account(currency="CNY")
    assert debited(payment) == world.pk and balance(world) == 0
    assert_ledger_ok()


def test_the_outside_s_sub_accounts_follow_it_through_freeze():
    user, _, _ = customer("frozen-outside")
    first, second = provider_payments(user, 2)
    settle(first)
    world = external_account(currency="CNY")
    account_freeze(account_id=world.pk)
    assert {s.status for s in outside_subs()} == {Account.Status.FROZEN}
    assert sweep_merchant_sub_accounts() == 1  # the merchant's: it takes money in
    with pytest.raises(AccountNotActive), transaction.atomic():
        settle(second)  # refused, as the frozen outside row would refuse it
    account_unfreeze(account_id=world.pk)
    assert {s.status for s in outside_subs()} == {Account.Status.ACTIVE}
    assert settle(second).status == Payment.Status.SUCCEEDED
    assert ledger_report()["warnings"] == []
    assert_ledger_ok()


def test_check_ledger_names_an_outside_sub_account_under_the_wrong_parent():
    user, _, _ = customer("astray-outside")
    (payment,) = provider_payments(user, 1)
    settle(payment)
    (sub,) = outside_subs()
    usd = Account.objects.create(
        code="external-usd", kind=Account.Kind.EXTERNAL, currency="USD"
    )
    Account.objects.filter(pk=sub.pk).update(parent=usd)
    assert ledger_report()["violations"] == [
        f"account {sub.pk} is not an external sub-account of external account {usd.pk}"
    ]


def test_the_back_office_says_an_outside_sub_account_closes_with_the_outside(
    admin_client,
):
    """Closing one alone is refused (as a merchant's is); the page names what it
    closes with: the outside world's account, not a merchant."""
    user, _, _ = customer("close-outside")
    (payment,) = provider_payments(user, 1)
    settle(payment)
    (sub,) = outside_subs()
    page = admin_client.post(
        f"/admin/ledger/account/backoffice/close/?ids={sub.pk}",
        {f"status_{sub.pk}": sub.status_version},
        follow=True,
    ).content.decode()
    assert "merchant" not in page.split('class="messagelist"')[1].split("</ul>")[0]
    assert "It closes with the outside world&#x27;s account." in page
    assert Account.objects.get(pk=sub.pk).status == Account.Status.ACTIVE


@pytest.mark.django_db(transaction=True)
def test_a_charge_refunded_at_the_provider_settles_and_refunds_beside_a_sweep(
    monkeypatch, on_postgres
):
    """A pending payment whose charge the provider collected and refunded is
    settled and refunded in one transaction (`payment_apply_charge`). The refund
    gives back from the sub-account the settlement has just credited and holds,
    without reaching for the merchant's own row afterwards: a sweep of that
    sub-account locks the merchant's row first and waits for the sub-account, and
    the two would wait for each other."""
    import payments.services
    from ledger.services import merchant_credit_account, merchant_sweep
    from payments.provider_client import ProviderCharge
    from payments.services import payment_apply_charge

    user, _, _ = customer("refunded-beside-sweep")
    made: dict[int, list[Payment]] = {}
    while not any(len(pair) == 2 for pair in made.values()):
        payment = pending_provider_payment(place_order(user, amount=300))
        made.setdefault(sub_number(payment), []).append(payment)
    first, payment = next(pair for pair in made.values() if len(pair) == 2)
    settle(first)  # the sub-accounts exist and hold money
    sub = merchant_credit_account(currency="CNY", spread_by=f"provider:{payment.pk}")
    assert sub.parent_id is not None
    settled, go = threading.Event(), threading.Event()
    # The settlement `payment_apply_charge` runs under its locks, then the refund.
    real = payments.services._settle_its_charge

    def then_pause(*args):
        result = real(*args)
        settled.set()
        assert go.wait(30)
        return result

    monkeypatch.setattr(payments.services, "_settle_its_charge", then_pause)
    refunded = ProviderCharge(
        txn_id=payment.provider_txn_id,
        merchant_order_no=payment.order.merchant_order_no,
        amount=payment.amount,
        status="REFUNDED",
        pay_url="",
    )

    def apply() -> str:
        with transaction.atomic(durable=True):
            return payment_apply_charge(payment_id=payment.pk, charge=refunded).status

    def sweep():
        with transaction.atomic(durable=True):
            return merchant_sweep(account_id=sub.pk)

    applying = Background(apply)
    applying.start()
    assert settled.wait(30)
    sweeping = Background(sweep)
    sweeping.start()
    try:
        wait_for(lambda: blocked_on_lock(Account), 30, "the sweep to wait")
    finally:
        go.set()
    assert applying.outcome() == Payment.Status.REFUNDED
    assert isinstance(sweeping.outcome(), JournalEntry)
    assert Refund.objects.get(payment=payment).reason == "refunded_at_provider"
    assert_ledger_ok()
