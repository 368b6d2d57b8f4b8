"""Every change to money goes through these functions.

A balance moves only by a conditional UPDATE in the database
(`SET balance = balance + :amt, version = version + 1 WHERE id = :id AND balance -
held >= -:amt AND status = 'active'`), never by reading it into Python and writing it
back; zero rows updated means the guard refused, and we say which guard. A debit
needs the money `available` (`balance - held`): what a hold reserved is not spent
twice. Holds move `held` by the same kind of conditional UPDATE.

These services open `transaction.atomic()` but not a durable one: a payment must commit
its ledger entry in the same transaction as the order's new state and the idempotency
record that remembers the answer, so callers are allowed to wrap them.
"""

from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime

from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from idempotency.sql import insert_unless_exists

from .exceptions import (
    AccountNotActive,
    AccountNotFound,
    CurrencyMismatch,
    HoldNotActive,
    InsufficientFunds,
    ReferenceConflict,
    StaleVersion,
)
from .models import Account, Hold, JournalEntry, Posting

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
    return InsufficientFunds(
        balance=account.balance,
        held=account.held,
        available=account.available,
        amount=-amount,
    )


def _move(
    account_id: int, amount: int, currency: str, seen: int | None, release: int = 0
) -> None:
    accounts = Account.objects.filter(pk=account_id, currency=currency)
    if seen is not None:
        accounts = accounts.filter(version=seen)
    if amount < 0:
        # Money leaves only an active account, only what no hold reserved
        # (`balance - held >= :amt`, `held` less what this entry releases), and
        # never below zero unless it is the outside world.
        accounts = accounts.filter(status=Account.Status.ACTIVE).filter(
            Q(balance__gte=F("held") - release - amount) | Q(kind=Account.Kind.EXTERNAL)
        )
    else:
        accounts = accounts.exclude(status=Account.Status.CLOSED)
    changes = {"balance": F("balance") + amount, "version": F("version") + 1}
    if release:  # a captured hold: released in the same UPDATE as the debit
        accounts = accounts.filter(held__gte=release)
        changes["held"] = F("held") - release
    if not accounts.update(**changes):
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
    releases: Mapping[int, int] | None = None,
) -> JournalEntry:
    """Record one balanced journal entry and move the balances it names, once.

    The entry row is inserted first, so its unique `reference` is claimed before any
    balance moves: a replay, or a concurrent duplicate that waits on the unique index
    until the first transaction commits, finds the reference taken (`ON CONFLICT DO
    NOTHING`, no savepoint) and gets the existing entry back instead of moving money
    twice. Balances then move by conditional UPDATEs
    in account-id order, so two transfers in opposite directions cannot deadlock.
    `seen_versions` adds `AND version = :seen` for callers that read an account first.
    `releases` lowers an account's `held` in the same UPDATE that moves its balance
    (a captured hold, `hold_capture`); such an entry is never a replay.
    """
    ordered = _balanced_legs(legs)
    releases = releases or {}
    if set(releases) - {account_id for account_id, _ in ordered}:
        raise ValueError("a release names an account the entry does not move")
    entry = JournalEntry(
        reference=reference, kind=kind, currency=currency, description=description
    )
    if not insert_unless_exists(entry, ["reference"]):
        existing = JournalEntry.objects.get(reference=reference)
        if releases or not _same_movement(existing, ordered):
            raise ReferenceConflict(reference=reference)
        return existing
    seen_versions = seen_versions or {}
    for account_id, amount in ordered:
        _move(
            account_id,
            amount,
            currency,
            seen_versions.get(account_id),
            releases.get(account_id, 0),
        )
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
def hold_authorize(
    *, account_id: int, amount: int, reference: str, expires_at: datetime
) -> Hold:
    """Reserve `amount` of the account's available money until `expires_at`, once
    per reference.

    The hold row is inserted first, so its unique `reference` is claimed before
    `held` moves: a replay finds the hold and gets it back. Then one conditional
    UPDATE, `held = held + :amt WHERE id = :id AND balance - held >= :amt AND
    status = 'active'`; zero rows raises `InsufficientFunds` or `AccountNotActive`
    and the caller's transaction, hold row included, rolls back.
    """
    if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
        raise ValueError("a hold is a positive integer of minor units")
    hold = Hold(
        account_id=account_id, amount=amount, reference=reference, expires_at=expires_at
    )
    if not insert_unless_exists(hold, ["reference"]):
        existing = Hold.objects.get(reference=reference)
        if (existing.account_id, existing.amount) != (account_id, amount):
            raise ReferenceConflict(reference=reference)
        return existing
    held = Account.objects.filter(
        pk=account_id,
        status=Account.Status.ACTIVE,
        balance__gte=F("held") + amount,
    ).update(held=F("held") + amount)
    if not held:
        account = Account.objects.filter(pk=account_id).first()
        currency = account.currency if account else ""
        raise _refusal(account_id, -amount, currency, None)
    return hold


# How a release compares the hold's `expires_at` with now: a capture only before it,
# the expiry only after it, a void whenever.
_BEFORE_EXPIRY = " AND expires_at > %s"
_PAST_EXPIRY = " AND expires_at <= %s"


def _hold_close(hold_id: int, status: str, expiry: str = "") -> Hold:
    """Take an active hold to `status`; the caller releases its amount from `held`.

    One conditional `UPDATE ... WHERE status = 'active' RETURNING ...` (plus the
    `expiry` condition): of two closes racing, the second finds no row and raises
    `HoldNotActive`; only the winner goes on to lower `held`.
    """
    now = timezone.now()
    sql = (
        f"UPDATE {Hold._meta.db_table} SET status = %s, released_at = %s "  # noqa: S608
        f"WHERE id = %s AND status = %s{expiry} "
        "RETURNING account_id, amount, reference, expires_at, created_at"
    )
    params: list = [status, now, hold_id, Hold.Status.ACTIVE]
    if expiry:
        params.append(now)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        raise HoldNotActive(f"Hold {hold_id} is no longer active.")
    account_id, amount, reference, expires_at, created_at = row
    return Hold(
        pk=hold_id,
        account_id=account_id,
        amount=amount,
        status=status,
        reference=reference,
        expires_at=expires_at,
        created_at=created_at,
        released_at=now,
    )


def _hold_release(hold_id: int, status: str, expiry: str = "") -> Hold:
    """Close an active hold without moving money and give its amount back to
    `available` (`held = held - :amt`)."""
    hold = _hold_close(hold_id, status, expiry)
    released = Account.objects.filter(pk=hold.account_id, held__gte=hold.amount).update(
        held=F("held") - hold.amount
    )
    if not released:  # pragma: no cover - the check constraint keeps held >= 0
        raise RuntimeError(f"account {hold.account_id} holds less than hold {hold_id}")
    return hold


@transaction.atomic(savepoint=False)
def hold_capture(
    *,
    hold_id: int,
    amount: int,
    destination_id: int,
    currency: str,
    reference: str,
    kind: str = JournalEntry.Kind.PAYMENT,
    description: str = "",
) -> JournalEntry:
    """Release the whole hold and debit `amount` (at most the hold's) from its
    account to `destination_id`, in the caller's transaction: one journal entry.

    The hold moves `active -> captured` only if it is still active and not past
    `expires_at` (else `HoldNotActive`). Its whole amount leaves `held` in the same
    UPDATE that debits the account (`held = held - :hold, balance = balance - :amt
    WHERE balance - (held - :hold) >= :amt`), so the debit's guard sees the money
    the hold reserved, and the accounts are still updated in id order only (no
    deadlock with a payment or refund crossing the same two accounts). The entry's
    unique `reference` stops a second debit even if the hold's guard were bypassed.
    """
    hold = _hold_close(hold_id, Hold.Status.CAPTURED, _BEFORE_EXPIRY)
    if not 0 < amount <= hold.amount:
        raise ValueError(f"a capture moves 1..{hold.amount}, not {amount}")
    return ledger_post(
        reference=reference,
        kind=kind,
        currency=currency,
        legs=[(hold.account_id, -amount), (destination_id, amount)],
        description=description,
        releases={hold.account_id: hold.amount},
    )


def hold_void(*, hold_id: int) -> Hold:
    """Release an active hold without moving money (`HoldNotActive` otherwise)."""
    return _hold_release(hold_id, Hold.Status.VOIDED)


def hold_expire(*, hold_id: int) -> Hold:
    """Release an active hold past its `expires_at` (`HoldNotActive` otherwise)."""
    return _hold_release(hold_id, Hold.Status.EXPIRED, _PAST_EXPIRY)


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


def _account_transition(account_id: int, name: str) -> Account:
    with transaction.atomic(savepoint=False):
        account = Account.objects.select_for_update().get(pk=account_id)
        getattr(account, name)()
        account.save(update_fields=["status"])
    return account


def account_freeze(*, account_id: int) -> Account:
    """Freeze an active account: money can arrive but no longer leave."""
    return _account_transition(account_id, "freeze")


def account_unfreeze(*, account_id: int) -> Account:
    """Make a frozen account active again."""
    return _account_transition(account_id, "unfreeze")


def account_close(*, account_id: int) -> Account:
    """Close an account for good; nothing moves in or out afterwards."""
    return _account_transition(account_id, "close")


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
