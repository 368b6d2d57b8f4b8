"""Every change to money goes through these functions.

A balance moves only by a conditional UPDATE in the database
(`SET balance = balance + :amt, version = version + 1 WHERE id = :id AND balance >=
-:amt AND status = 'active'`), never by reading it into Python and writing it back;
zero rows updated means the guard refused, and we say which guard.

These services open `transaction.atomic()` but not a durable one: a payment must commit
its ledger entry in the same transaction as the order's new state and the idempotency
record that remembers the answer, so callers are allowed to wrap them.
"""

from collections import defaultdict
from collections.abc import Mapping, Sequence

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django_fsm import TransitionNotAllowed

from idempotency.sql import insert_unless_exists

from .exceptions import (
    AccountNotActive,
    AccountNotFound,
    AccountTransitionRefused,
    CurrencyMismatch,
    InsufficientFunds,
    NotAWallet,
    ReferenceConflict,
    StaleVersion,
)
from .models import Account, JournalEntry, Posting

Leg = tuple[int, int]  # (account id, signed amount in minor units)


def _balanced_legs(legs: Sequence[Leg]) -> list[Leg]:
    """Merge legs per account, sorted by account id (the order we lock rows in)."""
    merged: dict[int, int] = defaultdict(int)
    for account_id, amount in legs:
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise TypeError("amounts are integers in minor units")
        merged[account_id] += amount
    result = sorted((a, amt) for a, amt in merged.items() if amt != 0)
    if len(result) < 2:
        raise ValueError("a journal entry moves money between at least two accounts")
    if sum(amount for _, amount in result) != 0:
        raise ValueError("a journal entry's postings must sum to zero")
    return result


def _refusal(
    account_id: int, amount: int, currency: str, seen: int | None
) -> Exception:
    """Explain why the conditional update of `account_id` touched no row."""
    account = Account.objects.filter(pk=account_id).first()
    if account is None:
        return AccountNotFound(f"Account {account_id} does not exist.")
    if account.currency != currency:
        return CurrencyMismatch(
            f"Account {account_id} holds {account.currency}, the entry is {currency}."
        )
    if seen is not None and account.version != seen:
        return StaleVersion(account_id=account_id, version=account.version)
    if account.status == Account.Status.CLOSED or (
        amount < 0 and account.status != Account.Status.ACTIVE
    ):
        return AccountNotActive(f"Account {account_id} is {account.status}.")
    return InsufficientFunds(balance=account.balance, amount=-amount)


def _move(account_id: int, amount: int, currency: str, seen: int | None) -> None:
    accounts = Account.objects.filter(pk=account_id, currency=currency)
    if seen is not None:
        accounts = accounts.filter(version=seen)
    if amount < 0:
        # Money leaves only an active account, and never below zero unless it is the
        # outside world.
        accounts = accounts.filter(status=Account.Status.ACTIVE).filter(
            Q(balance__gte=-amount) | Q(kind=Account.Kind.EXTERNAL)
        )
    else:
        accounts = accounts.exclude(status=Account.Status.CLOSED)
    if not accounts.update(balance=F("balance") + amount, version=F("version") + 1):
        raise _refusal(account_id, amount, currency, seen)


def _same_movement(entry: JournalEntry, legs: list[Leg]) -> bool:
    recorded = sorted(entry.postings.values_list("account_id", "amount"))
    return recorded == legs


@transaction.atomic(savepoint=False)
def ledger_post(
    *,
    reference: str,
    kind: str,
    currency: str,
    legs: Sequence[Leg],
    description: str = "",
    seen_versions: Mapping[int, int] | None = None,
) -> JournalEntry:
    """Record one balanced journal entry and move the balances it names, once.

    The entry row is inserted first, so its unique `reference` is claimed before any
    balance moves: a replay, or a concurrent duplicate that waits on the unique index
    until the first transaction commits, finds the reference taken (`ON CONFLICT DO
    NOTHING`, no savepoint) and gets the existing entry back instead of moving money
    twice. Balances then move by conditional UPDATEs
    in account-id order, so two transfers in opposite directions cannot deadlock.
    `seen_versions` adds `AND version = :seen` for callers that read an account first.
    """
    ordered = _balanced_legs(legs)
    entry = JournalEntry(
        reference=reference, kind=kind, currency=currency, description=description
    )
    if not insert_unless_exists(entry, ["reference"]):
        existing = JournalEntry.objects.get(reference=reference)
        if not _same_movement(existing, ordered):
            raise ReferenceConflict(reference=reference)
        return existing
    seen_versions = seen_versions or {}
    for account_id, amount in ordered:
        _move(account_id, amount, currency, seen_versions.get(account_id))
    Posting.objects.bulk_create(
        Posting(entry=entry, account_id=account_id, amount=amount)
        for account_id, amount in ordered
    )
    return entry


def external_account(*, currency: str) -> Account:
    """The outside world for `currency`: the source of deposits."""
    account, _ = Account.objects.get_or_create(
        code=f"external-{currency.lower()}",
        defaults={"kind": Account.Kind.EXTERNAL, "currency": currency},
    )
    return account


def merchant_account(*, currency: str) -> Account:
    """The shop's own account for `currency`: where customers' payments land."""
    account, _ = Account.objects.get_or_create(
        code=f"merchant-{currency.lower()}",
        defaults={"kind": Account.Kind.MERCHANT, "currency": currency},
    )
    return account


def wallet_get_or_create(*, owner_id: int, currency: str) -> Account:
    """Return the user's wallet in `currency`, creating it once (a unique constraint
    settles a race between two first requests). By the owner's id, so a caller that
    holds only a row pointing at the user need not load it."""
    wallets = Account.objects.filter(
        owner_id=owner_id, kind=Account.Kind.WALLET, currency=currency
    )
    wallet = wallets.first()
    if wallet is not None:
        return wallet
    try:
        with transaction.atomic():
            return Account.objects.create(
                owner_id=owner_id, kind=Account.Kind.WALLET, currency=currency
            )
    except IntegrityError:
        return wallets.get()


def ledger_deposit(
    *, account_id: int, amount: int, reference: str, description: str = ""
) -> JournalEntry:
    """Bring `amount` into `account_id` from the outside world, once per reference."""
    if amount <= 0:
        raise ValueError("a deposit is a positive amount")
    account = Account.objects.only("currency").get(pk=account_id)
    world = external_account(currency=account.currency)
    return ledger_post(
        reference=reference,
        kind=JournalEntry.Kind.DEPOSIT,
        currency=account.currency,
        legs=[(world.pk, -amount), (account_id, amount)],
        description=description,
    )


def ledger_transfer(
    *,
    source_id: int,
    destination_id: int,
    amount: int,
    currency: str,
    reference: str,
    kind: str = JournalEntry.Kind.TRANSFER,
    description: str = "",
    seen_version: int | None = None,
) -> JournalEntry:
    """Debit `source_id` and credit `destination_id` by `amount`, once per reference.

    `seen_version` is the source account's version the caller read before deciding;
    if the account moved since, nothing happens and `StaleVersion` is raised.
    """
    if amount <= 0:
        raise ValueError("a transfer moves a positive amount")
    return ledger_post(
        reference=reference,
        kind=kind,
        currency=currency,
        legs=[(source_id, -amount), (destination_id, amount)],
        description=description,
        seen_versions={source_id: seen_version} if seen_version is not None else None,
    )


@transaction.atomic(savepoint=False)
def wallet_top_up(*, account_id: int, at_least: int) -> JournalEntry | None:
    """Deposit whatever brings the wallet up to `at_least`; nothing if it has that.

    The row is locked while we decide, and the deposit's reference names the version
    we decided on, so two concurrent top-ups cannot both deposit the difference.
    """
    account = Account.objects.select_for_update().get(pk=account_id)
    missing = at_least - account.balance
    if missing <= 0:
        return None
    return ledger_deposit(
        account_id=account.pk,
        amount=missing,
        reference=f"top-up:{account.pk}:v{account.version}",
        description="Top-up",
    )


def _account_transition(
    account_id: int, name: str, seen_version: int | None
) -> Account:
    """Take the transition `name` under the account's row lock, and bump its version.

    `seen_version` is the version the caller showed its user (the admin's
    confirmation page): if the account changed since, nothing happens and
    `StaleVersion` is raised, so a second press of the same button, or two staff
    members at once, change the account once. An edge the state machine does not
    have (freezing a frozen account) raises `AccountTransitionRefused`.
    """
    with transaction.atomic(savepoint=False):
        account = Account.objects.select_for_update().get(pk=account_id)
        if seen_version is not None and account.version != seen_version:
            raise StaleVersion(account_id=account_id, version=account.version)
        try:
            getattr(account, name)()
        except TransitionNotAllowed:
            raise AccountTransitionRefused(
                f"Account {account_id} is {account.status}: it cannot {name}.",
                status_now=account.status,
            ) from None
        account.version += 1
        account.save(update_fields=["status", "version"])
    return account


def account_freeze(*, account_id: int, seen_version: int | None = None) -> Account:
    """Freeze an active account: money can arrive but no longer leave."""
    return _account_transition(account_id, "freeze", seen_version)


def account_unfreeze(*, account_id: int, seen_version: int | None = None) -> Account:
    """Make a frozen account active again."""
    return _account_transition(account_id, "unfreeze", seen_version)


def account_close(*, account_id: int, seen_version: int | None = None) -> Account:
    """Close an account for good; nothing moves in or out afterwards."""
    return _account_transition(account_id, "close", seen_version)


def account_credit(
    *, account_id: int, amount: int, reference: str, description: str = ""
) -> JournalEntry:
    """Credit a customer's wallet from the outside world (a deposit entry), once per
    reference: the staff's "credit" button. Only wallets: the shop's own and the
    outside world's accounts move through payments and refunds."""
    if not Account.objects.filter(pk=account_id, kind=Account.Kind.WALLET).exists():
        raise NotAWallet(f"Account {account_id} is not a customer wallet.")
    return ledger_deposit(
        account_id=account_id,
        amount=amount,
        reference=reference,
        description=description,
    )


def customer_get_or_create(
    *, username: str, password: str | None = None, currency: str
) -> tuple[User, str, Account]:
    """Return (user, API token, wallet) for `username`, creating what is missing.

    Running it again returns the same user and token; a given password replaces the
    web UI password.
    """
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    user, created = get_user_model().objects.get_or_create(username=username)
    if password is not None:
        user.set_password(password)
        user.save(update_fields=["password"])
    elif created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    token, _ = Token.objects.get_or_create(user=user)
    wallet = wallet_get_or_create(owner_id=user.pk, currency=currency)
    return user, token.key, wallet
