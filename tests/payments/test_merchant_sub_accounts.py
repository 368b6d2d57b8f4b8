"""Merchant sub-accounts (`MERCHANT_SUB_ACCOUNTS`): payments credit one of the
merchant's N sub-accounts, a beat task sweeps them up into the merchant's account,
refunds find the money wherever it is, and `check_ledger` counts it all."""

import threading
import time
import zlib

import pytest
from django.core import checks
from django.db import transaction
from django.db.models import Q

import ledger.services
import payments.services
from ledger.exceptions import (
    AccountBusy,
    AccountNotActive,
    AccountNotEmpty,
    AccountTransitionRefused,
)
from ledger.invariants import ledger_report
from ledger.models import Account, JournalEntry
from ledger.services import (
    account_close,
    account_freeze,
    account_unfreeze,
    ledger_transfer,
    merchant_account,
    merchant_credit_account,
    merchant_sub_code,
    merchant_sweep,
)
from ledger.tasks import sweep_merchant_sub_accounts
from orders.models import Order
from orders.services import order_cancel
from payments.models import Payment, ProviderEvent, Refund
from payments.services import (
    payment_authorize_with_balance,
    payment_capture,
    payment_pay_with_balance,
    payment_refund,
    payment_settle,
    provider_event_process,
)
from tests.conftest import Background, run_in_threads
from tests.helpers import (
    assert_ledger_ok,
    balance,
    blocked_on_lock,
    customer,
    event_body,
    new_key,
    pending_provider_payment,
    place_order,
    post_callback,
    row_locked,
    wait_for,
)

pytestmark = pytest.mark.django_db

SUBS = 4


@pytest.fixture(autouse=True)
def _spread(settings):
    settings.MERCHANT_SUB_ACCOUNTS = SUBS


def sub_accounts() -> list[Account]:
    """The merchant's sub-accounts (the outside world's are spread alike)."""
    subs = Account.objects.filter(parent__isnull=False, kind=Account.Kind.MERCHANT)
    return list(subs.order_by("pk"))


def in_subs() -> int:
    return sum(sub.balance for sub in sub_accounts())


def pay_orders(
    count: int, amount: int = 100, username: str = "spread"
) -> tuple[Account, list[Payment]]:
    user, _, wallet = customer(username, balance=count * amount)
    payments = [
        payment_pay_with_balance(order_id=place_order(user, amount=amount).pk)
        for _ in range(count)
    ]
    return wallet, payments


def refund_all(payments: list[Payment]) -> None:
    """Give every payment back: the merchant and its sub-accounts hold nothing."""
    for payment in payments:
        payment_refund(payment_id=payment.pk)
    assert (balance(merchant_account(currency="CNY")), in_subs()) == (0, 0)


def test_payments_land_on_sub_accounts_and_check_ledger_counts_them():
    _, payments = pay_orders(12)
    main = merchant_account(currency="CNY")
    subs = sub_accounts()
    assert balance(main) == 0
    assert 2 <= len(subs) <= SUBS  # twelve payments hash to several of the four
    assert {(s.kind, s.parent_id, s.currency) for s in subs} == {
        (Account.Kind.MERCHANT, main.pk, "CNY")
    }
    assert in_subs() == 1200
    for payment in payments:  # the same payment always picks the same sub-account
        credited = merchant_credit_account(
            currency="CNY", spread_by=payment.journal_entry.reference
        )
        assert payment.journal_entry.postings.filter(account=credited).exists()
    report = assert_ledger_ok()
    assert report["merchants"][main.code] == {
        "currency": "CNY",
        "balance": 1200,
        "in_sub_accounts": 1200,
        "sub_accounts": len(subs),
    }


def test_without_the_setting_payments_credit_the_merchant_itself(settings):
    settings.MERCHANT_SUB_ACCOUNTS = 0
    pay_orders(3)
    assert balance(merchant_account(currency="CNY")) == 300
    assert sub_accounts() == []


def test_the_sweep_moves_everything_up_once_and_a_retry_moves_nothing():
    pay_orders(12)
    used = len(sub_accounts())
    assert sweep_merchant_sub_accounts() == used
    main = merchant_account(currency="CNY")
    assert (balance(main), in_subs()) == (1200, 0)
    sweeps = JournalEntry.objects.filter(reference__startswith="sweep:")
    assert sweeps.count() == used
    assert {e.kind for e in sweeps} == {JournalEntry.Kind.TRANSFER}
    # A redelivered task, or the same sub-account swept again by hand.
    assert sweep_merchant_sub_accounts() == 0
    with transaction.atomic():
        assert merchant_sweep(account_id=sub_accounts()[0].pk) is None
    assert sweeps.count() == used
    report = assert_ledger_ok()
    assert report["merchants"][main.code]["in_sub_accounts"] == 0
    assert report["merchants"][main.code]["balance"] == 1200


def test_a_sweep_of_an_account_that_is_no_sub_account_is_refused():
    pay_orders(1)
    with pytest.raises(ValueError), transaction.atomic():
        merchant_sweep(account_id=merchant_account(currency="CNY").pk)


def test_a_refund_before_the_sweep_comes_from_the_sub_account():
    wallet, (payment, _other) = pay_orders(2, amount=700)
    payment_refund(payment_id=payment.pk)
    assert balance(wallet) == 700
    assert in_subs() == 700 and balance(merchant_account(currency="CNY")) == 0
    assert_ledger_ok()


def test_a_refund_after_the_sweep_comes_from_the_merchant():
    wallet, (payment,) = pay_orders(1, amount=700)
    sweep_merchant_sub_accounts()
    payment_refund(payment_id=payment.pk)
    assert balance(wallet) == 700
    assert (in_subs(), balance(merchant_account(currency="CNY"))) == (0, 0)
    assert_ledger_ok()


def test_a_refund_over_the_api_retried_gives_back_once():
    user, client, wallet = customer("api", balance=900)
    payment = payment_pay_with_balance(order_id=place_order(user, amount=900).pk)
    key = new_key()
    responses = [
        client.post(
            f"/api/v1/payments/{payment.pk}/refund",
            {},
            format="json",
            headers={"Idempotency-Key": key},
        )
        for _ in range(3)
    ]
    assert [r.status_code for r in responses] == [201] * 3
    assert balance(wallet) == 900 and in_subs() == 0
    assert_ledger_ok()


def test_a_capture_credits_a_sub_account():
    user, _, wallet = customer("holder", balance=1000)
    order = place_order(user, amount=1000)
    payment = payment_authorize_with_balance(order_id=order.pk, hold_seconds=600)
    payment_capture(payment_id=payment.pk, amount=400)
    assert (balance(wallet), in_subs()) == (600, 400)
    assert balance(merchant_account(currency="CNY")) == 0
    assert_ledger_ok()


def test_a_provider_payment_settles_on_a_sub_account_and_refunds_from_it():
    user, _, _ = customer("outside")
    payment = pending_provider_payment(place_order(user, amount=800))
    assert post_callback(event_body(payment)).status_code == 200
    provider_event_process(event_id=ProviderEvent.objects.get().pk)
    assert in_subs() == 800
    payment_refund(payment_id=payment.pk)
    assert in_subs() == 0
    assert_ledger_ok()


def test_a_late_provider_success_is_given_back_from_the_sub_account_it_hit():
    user, _, _ = customer("late")
    order = place_order(user, amount=800)
    payment = pending_provider_payment(order)
    order_cancel(order_id=order.pk)  # cancelled while the shopper still paid
    assert post_callback(event_body(payment)).status_code == 200
    provider_event_process(event_id=ProviderEvent.objects.get().pk)
    payment.refresh_from_db()
    assert payment.status == Payment.Status.REFUNDED
    (sub,) = sub_accounts()  # the success landed there, and went back from there
    assert payment.journal_entry.postings.get(amount__gt=0).account_id == sub.pk
    refund = Refund.objects.get(payment=payment).journal_entry.postings
    assert refund.get(amount__lt=0).account_id == sub.pk
    assert in_subs() == 0 and balance(merchant_account(currency="CNY")) == 0
    assert_ledger_ok()


def test_a_frozen_sub_account_is_left_alone_and_the_others_swept(caplog):
    pay_orders(12)
    frozen, *others = sub_accounts()
    account_freeze(account_id=frozen.pk)
    assert sweep_merchant_sub_accounts() == len(others)
    assert in_subs() == balance(frozen) > 0
    assert "not active" not in caplog.text  # not tried: money leaves active ones
    with pytest.raises(AccountNotActive), transaction.atomic():
        merchant_sweep(account_id=frozen.pk)
    assert_ledger_ok()


def test_check_ledger_names_a_sub_account_under_the_wrong_merchant():
    pay_orders(1)
    (sub,) = sub_accounts()
    usd = Account.objects.create(
        code="merchant-usd", kind=Account.Kind.MERCHANT, currency="USD"
    )
    Account.objects.filter(pk=sub.pk).update(parent=usd)
    violations = ledger_report()["violations"]
    assert violations == [
        f"account {sub.pk} is not a merchant sub-account of merchant account {usd.pk}"
    ]


@pytest.mark.parametrize("count", [-1, 1025])
def test_a_setting_out_of_range_is_refused_at_start_up(settings, count):
    settings.MERCHANT_SUB_ACCOUNTS = count
    errors = [m for m in checks.run_checks() if m.id == "ledger.E003"]
    assert len(errors) == 1 and str(count) in errors[0].msg


@pytest.mark.django_db(transaction=True)
def test_payments_refunds_and_sweeps_racing_move_every_unit_once(on_postgres):
    """Twenty payers, four refunds of earlier payments and four sweepers, at once:
    every payment lands once, every refund comes back once, nothing deadlocks."""
    users = [customer(f"racer{i}", balance=500)[0] for i in range(24)]
    early = [
        payment_pay_with_balance(order_id=place_order(user, amount=500).pk)
        for user in users[20:]
    ]
    orders = [place_order(user, amount=500) for user in users[:20]]

    def work(i: int):
        if i < 20:
            return payment_pay_with_balance(order_id=orders[i].pk).status
        if i < 24:
            return payment_refund(payment_id=early[i - 20].pk).amount
        return [sweep_merchant_sub_accounts() for _ in range(5)]

    results = run_in_threads(28, work)
    assert not [r for r in results if isinstance(r, Exception)], results
    sweep_merchant_sub_accounts()
    main = merchant_account(currency="CNY")
    assert (balance(main), in_subs()) == (20 * 500, 0)
    report = assert_ledger_ok()
    assert report["merchants"][main.code]["balance"] == 20 * 500


def test_beat_sweeps_every_minute(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["ledger-sweep-merchant-sub-accounts"]
    assert entry == {
        "task": "ledger.tasks.sweep_merchant_sub_accounts",
        "schedule": 60.0,
    }


@pytest.mark.django_db(transaction=True)
def test_a_sweep_that_dies_half_way_is_finished_by_the_next_one(monkeypatch):
    """Each sub-account is swept in its own transaction: a worker dying after the
    first leaves that one swept and the rest for the next run, nothing twice."""
    import ledger.tasks

    pay_orders(12)
    used = len(sub_accounts())
    real = ledger.tasks.merchant_sweep
    calls = []

    def dies_on_the_second(*, account_id):
        calls.append(account_id)
        if len(calls) == 2:
            raise SystemExit("worker killed")
        return real(account_id=account_id)

    monkeypatch.setattr(ledger.tasks, "merchant_sweep", dies_on_the_second)
    with pytest.raises(SystemExit):
        sweep_merchant_sub_accounts()
    assert JournalEntry.objects.filter(reference__startswith="sweep:").count() == 1
    monkeypatch.setattr(ledger.tasks, "merchant_sweep", real)
    assert sweep_merchant_sub_accounts() == used - 1
    assert JournalEntry.objects.filter(reference__startswith="sweep:").count() == used
    assert (balance(merchant_account(currency="CNY")), in_subs()) == (1200, 0)
    assert_ledger_ok()


def test_a_sub_account_closes_only_with_its_merchant(admin_client):
    """A payment may have chosen the sub-account a moment before, its merchant
    active: closed alone, it would refuse that payment though the merchant takes
    money. (Freezing one alone stays possible: frozen, it still takes money in.)"""
    _, made = pay_orders(12)
    sub = sub_accounts()[0]
    refused = pytest.raises(AccountTransitionRefused, match="closes with its merchant")
    with refused, transaction.atomic():
        account_close(account_id=sub.pk)
    page = admin_client.post(
        f"/admin/ledger/account/backoffice/close/?ids={sub.pk}",
        {f"status_{sub.pk}": sub.status_version},
        follow=True,
    )
    assert "It closes with its merchant." in page.content.decode()
    assert {s.status for s in sub_accounts()} == {Account.Status.ACTIVE}
    refund_all(made)
    account_close(account_id=merchant_account(currency="CNY").pk)
    assert {s.status for s in sub_accounts()} == {Account.Status.CLOSED}


def test_payments_that_would_land_on_a_closed_sub_account_credit_the_merchant():
    """(Sub-accounts closed alone, before that was refused.)"""
    pay_orders(12)
    sweep_merchant_sub_accounts()
    closed = sub_accounts()[0]
    Account.objects.filter(pk=closed.pk).update(status=Account.Status.CLOSED)
    _, payments = pay_orders(12, username="later")
    assert balance(closed) == 0
    main = merchant_account(currency="CNY")
    landed = {p.journal_entry.postings.get(amount__gt=0).account_id for p in payments}
    assert closed.pk not in landed
    hashed_there = merchant_sub_code("CNY", int(closed.code.rsplit("-", 1)[1]))
    assert any(  # some of them would have gone to the closed one
        merchant_sub_code("CNY", zlib.crc32(p.journal_entry.reference.encode()) % SUBS)
        == hashed_there
        for p in payments
    )
    assert main.pk in landed
    assert balance(main) + in_subs() == 2400
    payment_refund(payment_id=payments[0].pk)  # wherever it landed
    assert_ledger_ok()


def orders_on_one_sub_account(user, amounts: list[int], number=None) -> list[Order]:
    """Orders whose payments hash to one sub-account (`number`, or the first
    order's); the others are cancelled."""
    found: list[Order] = []
    while len(found) < len(amounts):
        order = place_order(user, amount=amounts[len(found)])
        if number is None:
            number = sub_number(order)
        if sub_number(order) == number:
            found.append(order)
        else:
            order_cancel(order_id=order.pk)
    return found


def sub_number(order: Order) -> int:
    return zlib.crc32(f"payment:{order.pk}".encode()) % SUBS


def merchant_money() -> int:
    return sum(
        Account.objects.filter(kind=Account.Kind.MERCHANT).values_list(
            "balance", flat=True
        )
    )


def test_a_refund_takes_what_the_sub_account_has_and_the_rest_from_the_merchant():
    user, _, wallet = customer("split", balance=1100)
    first, second, third = orders_on_one_sub_account(user, [500, 300, 300])
    a = payment_pay_with_balance(order_id=first.pk)
    sweep_merchant_sub_accounts()  # the merchant 500, the sub-account 0
    b = payment_pay_with_balance(order_id=second.pk)
    c = payment_pay_with_balance(order_id=third.pk)  # the sub-account 600
    payment_refund(payment_id=a.pk)  # from the sub-account: 100 left there
    payment_refund(payment_id=b.pk)  # 100 from there, 200 from the merchant
    payment_refund(payment_id=c.pk)  # 300 from the merchant
    assert (balance(wallet), merchant_money()) == (1100, 0)
    split = Refund.objects.get(payment=b).journal_entry.postings
    assert sorted(split.values_list("amount", flat=True)) == [-200, -100, 300]
    assert_ledger_ok()


def test_a_frozen_merchant_gives_nothing_back_from_its_sub_accounts():
    user, _, wallet = customer("frozen-merchant", balance=1000)
    payment = payment_pay_with_balance(order_id=place_order(user, amount=400).pk)
    account_freeze(account_id=merchant_account(currency="CNY").pk)
    with pytest.raises(AccountNotActive), transaction.atomic():
        payment_refund(payment_id=payment.pk)
    assert (balance(wallet), in_subs()) == (600, 400)
    payment.refresh_from_db()
    assert payment.status == Payment.Status.SUCCEEDED


def test_a_closed_merchant_takes_no_payment_on_its_sub_accounts():
    user, _, wallet = customer("closed-merchant", balance=1000)
    account_close(account_id=merchant_account(currency="CNY").pk)
    order = place_order(user, amount=400)
    with pytest.raises(AccountNotActive), transaction.atomic():
        payment_pay_with_balance(order_id=order.pk)
    assert (balance(wallet), in_subs()) == (1000, 0)
    assert sub_accounts() == [] or sweep_merchant_sub_accounts() == 0


def test_payments_to_a_frozen_sub_account_go_to_the_merchant_and_no_sweep_tries_it(
    caplog,
):
    user, _, _ = customer("frozen-sub", balance=2000)
    (order,) = orders_on_one_sub_account(user, [100])
    payment_pay_with_balance(order_id=order.pk)
    (sub,) = sub_accounts()
    account_freeze(account_id=sub.pk)
    (later,) = orders_on_one_sub_account(user, [100], number=sub_number(order))
    payment_pay_with_balance(order_id=later.pk)
    main = merchant_account(currency="CNY")
    assert (balance(sub), balance(main)) == (100, 100)
    assert sweep_merchant_sub_accounts() == 0
    assert "not active" not in caplog.text
    assert_ledger_ok()


@pytest.mark.django_db(transaction=True)
def test_a_late_provider_success_given_back_while_sweeps_run(on_postgres):
    """The settlement credits a sub-account and gives the money back in the same
    transaction, holding that row: sweeps of it wait, and nothing deadlocks."""
    pay_orders(12)  # money on the sub-accounts for the sweeps to move meanwhile
    user, _, _ = customer("late-race")
    orders = [place_order(user, amount=800) for _ in range(6)]
    payments = [pending_provider_payment(order) for order in orders]
    for order in orders:
        order_cancel(order_id=order.pk)  # every success comes in late

    def work(i: int):
        if i < 6:
            with transaction.atomic(durable=True):
                return payment_settle(
                    payment_id=payments[i].pk,
                    provider_txn_id=payments[i].provider_txn_id,
                ).status
        return [sweep_merchant_sub_accounts() for _ in range(10)]

    results = run_in_threads(9, work)
    assert results[:6] == [Payment.Status.REFUNDED] * 6, results
    assert not [r for r in results[6:] if isinstance(r, Exception)], results
    assert merchant_money() == 1200
    assert_ledger_ok()


def test_the_merchant_s_sub_accounts_follow_it_through_freeze_and_close():
    _, payments = pay_orders(12)
    main = merchant_account(currency="CNY")
    account_freeze(account_id=main.pk)
    assert {sub.status for sub in sub_accounts()} == {Account.Status.FROZEN}
    account_unfreeze(account_id=main.pk)
    assert {sub.status for sub in sub_accounts()} == {Account.Status.ACTIVE}
    refund_all(payments)  # only an empty merchant closes
    account_close(account_id=main.pk)
    assert {sub.status for sub in sub_accounts()} == {Account.Status.CLOSED}
    assert ledger_report()["warnings"] == []


@pytest.mark.django_db(transaction=True)
def test_a_merchant_does_not_close_over_a_credit_in_flight_on_a_sub_account(
    on_postgres,
):
    """A credit to a sub-account of an empty merchant has not committed when staff
    close the merchant: the close waits for it, sees the money and refuses, instead
    of closing a sub-account that would then keep that money for good."""
    _, made = pay_orders(12)
    refund_all(made)
    main, sub = merchant_account(currency="CNY"), sub_accounts()[0]
    _, _, wallet = customer("in-flight", balance=100)
    credited, go = threading.Event(), threading.Event()

    def credit() -> None:
        with transaction.atomic():
            ledger_transfer(
                source_id=wallet.pk,
                destination_id=sub.pk,
                amount=100,
                currency="CNY",
                reference="in-flight",
            )
            credited.set()
            go.wait(30)

    payer = Background(credit)
    payer.start()
    assert credited.wait(30)
    closer = Background(lambda: account_close(account_id=main.pk))
    closer.start()
    wait_for(blocked_on_lock, 30, "the close waiting for the credit")
    go.set()
    assert payer.outcome() is None
    refused = closer.outcome()
    assert isinstance(refused, AccountNotEmpty), refused
    assert refused.account_id == sub.pk
    statuses = {
        a.status for a in Account.objects.filter(Q(pk=main.pk) | Q(parent=main))
    }
    assert statuses == {Account.Status.ACTIVE}
    assert balance(sub) == 100
    assert_ledger_ok()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("first", ["payment", "close"])
def test_a_merchant_closing_while_a_payment_makes_its_sub_account(on_postgres, first):
    """The payment's new sub-account would reference the merchant only at COMMIT
    (deferred foreign keys), unseen by a close running meanwhile: the merchant
    closed with a sub-account holding money it could never move. Whichever goes
    first, the other waits: the close then sees the money and refuses, or the
    payment finds the merchant closed and is refused."""
    main = merchant_account(currency="CNY")  # empty, no sub-account yet
    user, _, wallet = customer("payer", balance=500)
    (order,) = orders_on_one_sub_account(user, [500])
    started, go = threading.Event(), threading.Event()

    def hold_open(work):
        def run():
            with transaction.atomic():
                done = work()
                started.set()
                assert go.wait(30)
            return done

        return Background(run)

    pay = lambda: payment_pay_with_balance(order_id=order.pk)  # noqa: E731
    close = lambda: account_close(account_id=main.pk)  # noqa: E731
    holder = hold_open(pay if first == "payment" else close)
    holder.start()
    assert started.wait(30)
    other = Background(close if first == "payment" else pay)
    other.start()
    if first == "payment":  # the close tries again and again (NOWAIT) meanwhile
        time.sleep(0.5)
    else:
        wait_for(blocked_on_lock, 30, "the payment to wait for the close")
    go.set()
    held, waited = holder.outcome(), other.outcome()
    main.refresh_from_db()
    subs = list(Account.objects.filter(parent=main))
    if first == "payment":
        assert isinstance(held, Payment), held
        assert isinstance(waited, AccountNotEmpty), waited
        assert main.status == Account.Status.ACTIVE
        assert [(s.status, s.balance) for s in subs] == [(Account.Status.ACTIVE, 500)]
    else:
        assert held.status == Account.Status.CLOSED
        assert isinstance(waited, AccountNotActive), waited
        assert subs == [] and balance(wallet) == 500
    assert_ledger_ok()
    assert ledger_report()["warnings"] == []


@pytest.mark.django_db(transaction=True)
def test_a_close_never_queues_for_the_merchant_row(monkeypatch, on_postgres):
    """A payment making a sub-account share-locks the merchant, then debits its
    wallet; a refund holding that wallet needs the merchant row next. Had the close
    queued FOR UPDATE on the merchant between them, the refund would have queued
    behind it: payment -> wallet -> refund -> close -> payment, a deadlock (a 500
    to someone). The close tries NOWAIT instead, so nothing waits for it."""
    user, _, wallet = customer(
        "w-first", balance=1000
    )  # its wallet before the merchant
    other, _, _ = customer("other", balance=1000)
    main = merchant_account(currency="CNY")
    assert wallet.pk < main.pk
    (paid_order,) = orders_on_one_sub_account(user, [100], number=0)
    paid = payment_pay_with_balance(order_id=paid_order.pk)
    (other_order,) = orders_on_one_sub_account(other, [100], number=0)
    paid_other = payment_pay_with_balance(order_id=other_order.pk)
    sweep_merchant_sub_accounts()  # refunds now take from the merchant's row
    (fresh,) = orders_on_one_sub_account(user, [100], number=1)  # a new sub-account
    chosen = payments.services.merchant_credit_account
    made, go_on = threading.Event(), threading.Event()

    def then_pause(**kwargs):
        account = chosen(**kwargs)
        if kwargs["spread_by"] == f"payment:{fresh.pk}":
            made.set()
            assert go_on.wait(30)
        return account

    monkeypatch.setattr(payments.services, "merchant_credit_account", then_pause)
    payer = Background(lambda: payment_pay_with_balance(order_id=fresh.pk))
    payer.start()
    assert made.wait(30)  # it holds FOR KEY SHARE on the merchant
    refunded_other, other_go = threading.Event(), threading.Event()

    def refund_other_held_open():
        with transaction.atomic():
            payment_refund(payment_id=paid_other.pk)  # the merchant's row, held
            refunded_other.set()
            assert other_go.wait(30)

    holder = Background(refund_other_held_open)
    holder.start()
    assert refunded_other.wait(30)
    closer = Background(lambda: account_close(account_id=main.pk))
    closer.start()
    time.sleep(0.3)
    refunder = Background(lambda: payment_refund(payment_id=paid.pk))
    refunder.start()  # its wallet, then the merchant's row
    time.sleep(0.5)
    go_on.set()  # the payer goes on to debit the wallet
    time.sleep(0.3)
    other_go.set()
    outcomes = [payer.outcome(), holder.outcome(), refunder.outcome()]
    assert [type(o).__name__ for o in outcomes] == ["Payment", "NoneType", "Refund"]
    assert isinstance(closer.outcome(), AccountNotEmpty), closer.outcome()
    assert merchant_account(currency="CNY").status == Account.Status.ACTIVE
    assert_ledger_ok()


@pytest.mark.django_db(transaction=True)
def test_a_close_that_cannot_lock_the_account_in_time_says_it_is_busy(
    monkeypatch, on_postgres
):
    main = merchant_account(currency="CNY")
    monkeypatch.setattr(ledger.services, "CLOSE_LOCK_SECONDS", 0.3)
    with row_locked(Account, main.pk), pytest.raises(AccountBusy):
        account_close(account_id=main.pk)
    assert merchant_account(currency="CNY").status == Account.Status.ACTIVE
    assert account_close(account_id=main.pk).status == Account.Status.CLOSED


def test_check_ledger_warns_of_a_sub_account_left_active_under_a_frozen_merchant():
    pay_orders(1)
    (sub,) = sub_accounts()
    main = merchant_account(currency="CNY")
    Account.objects.filter(pk=main.pk).update(status=Account.Status.FROZEN)
    assert ledger_report()["warnings"] == [
        f"merchant sub-account {sub.pk} is active under merchant account "
        f"{main.pk}, which is frozen"
    ]


@pytest.mark.django_db(transaction=True)
def test_a_merchant_closed_after_the_sub_account_was_chosen_takes_nothing(
    monkeypatch, on_postgres
):
    """Staff close the merchant between the payment's choice of a sub-account and
    its credit: the close reaches the sub-account too, and the credit is refused
    as the merchant's own row would have refused it."""
    _, made = pay_orders(12)  # the sub-accounts exist
    refund_all(made)  # and hold nothing, so that the merchant may close
    user, _, wallet = customer("race-close", balance=500)
    main = merchant_account(currency="CNY")
    order = place_order(user, amount=500)
    chosen = payments.services.merchant_credit_account

    def then_staff_close(**kwargs):
        account = chosen(**kwargs)  # the sub-account and the merchant are active
        closer = Background(lambda: account_close(account_id=main.pk))
        closer.start()
        assert not isinstance(closer.outcome(), Exception)
        return account

    monkeypatch.setattr(payments.services, "merchant_credit_account", then_staff_close)
    with pytest.raises(AccountNotActive):
        payment_pay_with_balance(order_id=order.pk)
    assert balance(wallet) == 500
    assert not Payment.objects.filter(order=order).exists()
    assert_ledger_ok()


@pytest.mark.django_db(transaction=True)
def test_a_refund_waiting_on_a_wallet_whose_payment_makes_a_sub_account(on_postgres):
    """The payment from wallet W creates a sub-account (its COMMIT checks the key
    of the merchant's row) while a refund to W holds the merchant's row and waits
    for W: the refund's lock lets the key check through, and both finish."""
    merchant_account(currency="CNY")  # the merchant's row before the wallet's
    user, _, wallet = customer("probe", balance=5000)
    (first,) = orders_on_one_sub_account(user, [100])
    paid = payment_pay_with_balance(order_id=first.pk)
    (fresh,) = orders_on_one_sub_account(
        user, [100], number=(sub_number(first) + 1) % SUBS
    )
    paying, go = threading.Event(), threading.Event()

    def pay():
        with transaction.atomic():
            payment = payment_pay_with_balance(order_id=fresh.pk)  # new sub-account
            paying.set()
            assert go.wait(10)
        return payment

    payer = Background(pay)
    payer.start()
    assert paying.wait(10)
    refunder = Background(lambda: payment_refund(payment_id=paid.pk))
    refunder.start()
    time.sleep(0.5)  # the refund holds the merchant's row and waits for W
    go.set()
    results = (payer.outcome(), refunder.outcome())
    assert not [r for r in results if isinstance(r, Exception)], results
    assert balance(wallet) == 4900
    assert_ledger_ok()
