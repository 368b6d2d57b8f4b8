import random
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.utils import DatabaseError

from ledger.exceptions import (
    AccountNotActive,
    AccountNotEmpty,
    CurrencyMismatch,
    InsufficientFunds,
    ReferenceConflict,
    StaleVersion,
)
from ledger.invariants import ledger_report
from ledger.models import Account, JournalEntry, Posting
from ledger.services import (
    account_close,
    account_freeze,
    hold_authorize,
    hold_void,
    ledger_deposit,
    ledger_post,
    ledger_transfer,
    wallet_top_up,
)
from tests.conftest import run_in_threads
from tests.factories import WalletFactory

pytestmark = pytest.mark.django_db


def funded_wallet(amount: int) -> Account:
    wallet: Account = WalletFactory()  # type: ignore[assignment]  # factory -> model
    if amount:
        ledger_deposit(
            account_id=wallet.pk, amount=amount, reference=f"fund:{wallet.pk}"
        )
    wallet.refresh_from_db()
    return wallet


def transfer(source: Account, destination: Account, amount: int, reference: str):
    return ledger_transfer(
        source_id=source.pk,
        destination_id=destination.pk,
        amount=amount,
        currency="CNY",
        reference=reference,
    )


def test_transfer_moves_money_and_bumps_versions():
    alice, bob = funded_wallet(1000), funded_wallet(0)
    entry = transfer(alice, bob, 300, "t-1")
    alice.refresh_from_db()
    bob.refresh_from_db()
    assert (alice.balance, bob.balance) == (700, 300)
    assert (alice.version, bob.version) == (2, 1)
    assert sorted(entry.postings.values_list("amount", flat=True)) == [-300, 300]
    assert ledger_report()["ok"]


def test_repeated_reference_moves_money_once_and_returns_the_same_entry():
    alice, bob = funded_wallet(1000), funded_wallet(0)
    first = transfer(alice, bob, 300, "t-1")
    second = transfer(alice, bob, 300, "t-1")
    assert first.pk == second.pk
    alice.refresh_from_db()
    assert alice.balance == 700
    assert JournalEntry.objects.filter(reference="t-1").count() == 1


def test_reference_reused_for_another_movement_is_refused():
    alice, bob = funded_wallet(1000), funded_wallet(0)
    transfer(alice, bob, 300, "t-1")
    with pytest.raises(ReferenceConflict), transaction.atomic():
        transfer(alice, bob, 301, "t-1")
    alice.refresh_from_db()
    assert alice.balance == 700


def test_insufficient_funds_changes_nothing_and_frees_the_reference():
    alice, bob = funded_wallet(100), funded_wallet(0)
    with pytest.raises(InsufficientFunds) as refused, transaction.atomic():
        transfer(alice, bob, 101, "t-1")
    assert refused.value.extra == {
        "balance": 100,
        "held": 0,
        "available": 100,
        "amount": 101,
    }
    assert not JournalEntry.objects.filter(reference="t-1").exists()
    alice.refresh_from_db()
    bob.refresh_from_db()
    assert (alice.balance, alice.version, bob.balance, bob.version) == (100, 1, 0, 0)
    # The refused attempt did not burn the reference: after a top-up it goes through.
    ledger_deposit(account_id=alice.pk, amount=1, reference="top")
    transfer(alice, bob, 101, "t-1")
    assert ledger_report()["ok"]


def test_money_leaves_only_an_active_account():
    alice, bob = funded_wallet(100), funded_wallet(100)
    account_freeze(account_id=alice.pk)
    with pytest.raises(AccountNotActive), transaction.atomic():
        transfer(alice, bob, 10, "out")
    transfer(bob, alice, 10, "in")  # a frozen account may still receive
    alice.refresh_from_db()
    assert alice.balance == 110


def test_only_an_account_that_holds_nothing_closes():
    """Nothing leaves a closed account: closing one that holds money, or reserves
    it for a hold, would keep that money there for good."""
    alice, bob = funded_wallet(100), funded_wallet(0)
    with pytest.raises(AccountNotEmpty, match=r"holds 100 CNY;"), transaction.atomic():
        account_close(account_id=alice.pk)
    hold = hold_authorize(
        account_id=alice.pk,
        amount=40,
        reference="hold",
        expires_in=timedelta(hours=1),
    )
    on_hold = r"holds 100 CNY \(40 on hold\)"
    with pytest.raises(AccountNotEmpty, match=on_hold), transaction.atomic():
        account_close(account_id=alice.pk)
    alice.refresh_from_db()
    assert (alice.status, alice.status_version) == (Account.Status.ACTIVE, 0)
    hold_void(hold_id=hold.pk)
    transfer(alice, bob, 100, "empty it")
    assert account_close(account_id=alice.pk).status == Account.Status.CLOSED
    with pytest.raises(AccountNotActive), transaction.atomic():
        transfer(bob, alice, 10, "into a closed account")
    report = ledger_report()
    assert report["ok"] and report["warnings"] == []


def test_check_ledger_warns_of_a_closed_account_that_holds_money():
    """Accounts closed before closing asked for an empty account."""
    alice = funded_wallet(100)
    Account.objects.filter(pk=alice.pk).update(status=Account.Status.CLOSED)
    assert ledger_report()["warnings"] == [
        f"account {alice.pk} is closed but holds 100 CNY (0 on hold)"
    ]


@pytest.mark.django_db(transaction=True)
def test_a_close_racing_credits_never_leaves_money_in_a_closed_account(on_postgres):
    """Credits from three threads while a fourth closes the empty account: the
    close either comes first (and every credit is refused) or sees money and is
    refused; never a closed account that holds money."""
    source = funded_wallet(10**6)
    for round_ in range(5):
        target = funded_wallet(0)

        def work(i: int, target=target, round_=round_):
            if i == 3:
                return account_close(account_id=target.pk).status
            transfer(source, target, 1, f"race:{round_}:{i}")
            return "credited"

        results = run_in_threads(4, work)
        target.refresh_from_db()
        closed = target.status == Account.Status.CLOSED
        assert not (closed and target.balance), (results, target.balance)
        credited = sum(r == "credited" for r in results)
        assert target.balance == credited
    report = ledger_report()
    assert report["ok"] and report["warnings"] == [], report


def test_currency_mismatch_is_refused():
    alice = funded_wallet(100)
    usd = WalletFactory(currency="USD")
    with pytest.raises(CurrencyMismatch), transaction.atomic():
        transfer(alice, usd, 10, "fx")
    assert ledger_report()["ok"]


def test_seen_version_guards_against_a_change_in_between():
    alice, bob = funded_wallet(100), funded_wallet(0)
    seen = alice.version
    transfer(alice, bob, 10, "other")  # somebody else spends meanwhile
    with pytest.raises(StaleVersion), transaction.atomic():
        ledger_transfer(
            source_id=alice.pk,
            destination_id=bob.pk,
            amount=10,
            currency="CNY",
            reference="mine",
            seen_version=seen,
        )
    alice.refresh_from_db()
    assert alice.balance == 90


def test_seen_version_guards_against_a_hold_in_between():
    """A hold changes what is available: a caller that decided on the version it
    read before the hold was placed, or released, is told the account changed."""
    alice, bob = funded_wallet(100), funded_wallet(0)
    for change in ("placed", "released"):
        seen = Account.objects.get(pk=alice.pk).version
        if change == "placed":
            hold = hold_authorize(
                account_id=alice.pk,
                amount=60,
                reference="hold-1",
                expires_in=timedelta(hours=1),
            )
        else:
            hold_void(hold_id=hold.pk)
        with pytest.raises(StaleVersion), transaction.atomic():
            ledger_transfer(
                source_id=alice.pk,
                destination_id=bob.pk,
                amount=10,
                currency="CNY",
                reference=f"mine-{change}",
                seen_version=seen,
            )
    alice.refresh_from_db()
    assert (alice.balance, alice.held) == (100, 0)


@pytest.mark.parametrize(
    "legs", [[(1, 5)], [(1, 5), (2, -4)], [(1, 0), (2, 0)], [(1, 1.5), (2, -1.5)]]
)
def test_malformed_entries_are_programming_errors(legs):
    with pytest.raises((ValueError, TypeError)):
        ledger_post(reference="x", kind="transfer", currency="CNY", legs=legs)


def test_top_up_deposits_only_the_difference():
    wallet = funded_wallet(300)
    wallet_top_up(account_id=wallet.pk, at_least=1000)
    wallet_top_up(account_id=wallet.pk, at_least=1000)
    assert wallet_top_up(account_id=wallet.pk, at_least=500) is None
    wallet.refresh_from_db()
    assert wallet.balance == 1000
    assert wallet.postings.count() == 2


def test_entries_are_append_only_in_the_database(on_postgres):
    alice, bob = funded_wallet(100), funded_wallet(0)
    entry = transfer(alice, bob, 10, "t")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        Posting.objects.filter(entry=entry).update(amount=1)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        Posting.objects.filter(entry=entry).delete()


@pytest.mark.django_db(transaction=True)
def test_random_transfers_from_8_threads_keep_every_invariant():
    rounds = 300 if connection.vendor == "postgresql" else 60
    wallets = [funded_wallet(10_000) for _ in range(20)]
    ids = [w.pk for w in wallets]
    total_before = sum(w.balance for w in wallets)

    def work(thread: int) -> tuple[int, int]:
        rng = random.Random(thread)
        done = refused = 0
        for n in range(rounds):
            source, destination = rng.sample(ids, 2)
            try:
                ledger_transfer(
                    source_id=source,
                    destination_id=destination,
                    amount=rng.randint(1, 3_000),
                    currency="CNY",
                    reference=f"race:{thread}:{n}",
                )
                done += 1
            except InsufficientFunds:
                refused += 1
        return done, refused

    results = run_in_threads(8, work)
    assert all(isinstance(r, tuple) for r in results), results
    assert sum(done for done, _ in results) > rounds  # the race did real work
    report = ledger_report()
    assert report["ok"], report["violations"]
    balances = list(
        Account.objects.filter(pk__in=ids).values_list("balance", flat=True)
    )
    assert min(balances) >= 0
    assert sum(balances) == total_before


@pytest.mark.django_db(transaction=True)
def test_one_reference_from_10_threads_moves_money_once():
    alice, bob = funded_wallet(1000), funded_wallet(0)
    results = run_in_threads(10, lambda _: transfer(alice, bob, 250, "once").pk)
    assert len(set(results)) == 1, results
    alice.refresh_from_db()
    bob.refresh_from_db()
    assert (alice.balance, bob.balance) == (750, 250)
    assert ledger_report()["ok"]


@pytest.mark.django_db(transaction=True)
def test_opposite_transfers_do_not_deadlock():
    alice, bob = funded_wallet(100_000), funded_wallet(100_000)

    def work(i: int) -> int:
        source, destination = (alice, bob) if i % 2 else (bob, alice)
        for n in range(50):
            transfer(source, destination, 7, f"x:{i}:{n}")
        return 50

    assert run_in_threads(6, work) == [50] * 6
    assert ledger_report()["ok"]


def test_a_refused_account_transition_says_what_the_account_cannot_be():
    from ledger.exceptions import AccountTransitionRefused
    from ledger.services import account_close, account_freeze, account_unfreeze

    wallet = WalletFactory()
    account_freeze(account_id=wallet.pk)
    with pytest.raises(AccountTransitionRefused) as refused, transaction.atomic():
        account_freeze(account_id=wallet.pk)
    assert refused.value.detail == (
        f"Account {wallet.pk} is frozen: it cannot be frozen."
    )
    account_unfreeze(account_id=wallet.pk)
    with pytest.raises(AccountTransitionRefused) as refused, transaction.atomic():
        account_unfreeze(account_id=wallet.pk)
    assert refused.value.detail.endswith("is active: it cannot be unfrozen.")
    account_close(account_id=wallet.pk)
    with pytest.raises(AccountTransitionRefused) as refused, transaction.atomic():
        account_close(account_id=wallet.pk)
    assert refused.value.detail.endswith("is closed: it cannot be closed.")
