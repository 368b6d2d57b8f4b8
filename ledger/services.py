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

import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet
from django.db.models.sql import UpdateQuery
from django.utils import timezone
from django_fsm import TransitionNotAllowed

from idempotency.sql import insert_many, insert_unless_exists

from .exceptions import (
    AccountBusy,
    AccountNotActive,
    AccountNotEmpty,
    AccountNotFound,
    AccountTransitionRefused,
    CurrencyMismatch,
    DomainError,
    HoldNotActive,
    InsufficientFunds,
    InvalidTransfer,
    NotAWallet,
    RecipientUnknown,
    ReferenceConflict,
    StaleVersion,
    SubAccountClosesWithMerchant,
    TransferBatchRefused,
)
from .journal import GENESIS, chain_hash
from .models import (
    Account,
    Hold,
    JournalEntry,
    JournalSeal,
    Posting,
    Transfer,
    TransferBatch,
)
from .texts import entry_english, entry_params

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


def _update_returning(rows: QuerySet[Account], **values: Any) -> tuple[int, int] | None:
    """`rows.update(**values)` that also answers the row's new balance and version
    (`UPDATE ... RETURNING`): a posting records them without another query. None
    when the guard matched no row."""
    query = cast(UpdateQuery, rows.query.chain(UpdateQuery))
    query.add_update_values(values)
    statement, params = query.get_compiler(rows.db).as_sql()
    table = connection.ops.quote_name(Account._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"{statement} RETURNING {table}.balance, {table}.version", params
        )
        return cursor.fetchone()


def _move(
    account_id: int,
    amount: int,
    currency: str,
    seen: int | None,
    postings: int = 1,
    release: int = 0,
) -> tuple[int, int]:
    """Move the balance by one conditional UPDATE; return (balance, version) after
    it. `postings` is how many postings the move sums (a batch's debits of one
    wallet move it once): the version counts each. `release` lowers `held` in the
    same UPDATE (a captured hold), and the debit's guard counts it as available."""
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
    changes: dict[str, Any] = {
        "balance": F("balance") + amount,
        "version": F("version") + postings,
    }
    if release:  # a captured hold: released in the same UPDATE as the debit
        accounts = accounts.filter(held__gte=release)
        changes["held"] = F("held") - release
    after = _update_returning(accounts, **changes)
    if after is None:
        raise _refusal(account_id, amount, currency, seen)
    return after


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
    params: Mapping[str, str] | None = None,
    seen_versions: Mapping[int, int] | None = None,
    releases: Mapping[int, int] | None = None,
) -> JournalEntry:
    """Record one balanced journal entry and move the balances it names, once.

    The entry row is inserted first, so its unique `reference` is claimed before any
    balance moves: a replay, or a concurrent duplicate that waits on the unique index
    until the first transaction commits, finds the reference taken (`ON CONFLICT DO
    NOTHING`, no savepoint) and gets the existing entry back instead of moving money
    twice. Balances then move by conditional UPDATEs
    in account-id order, so two transfers in opposite directions cannot deadlock;
    each UPDATE returns the balance and version it left, which its posting records.
    `seen_versions` adds `AND version = :seen` for callers that read an account first.
    `params` (see `ledger.texts.entry_params`) say what the entry is in any language;
    the English `description` is then written from them unless given.
    `releases` lowers an account's `held` in the same UPDATE that moves its balance
    (a captured hold, `hold_capture`); such an entry is never a replay.
    """
    ordered = _balanced_legs(legs)
    releases = releases or {}
    if set(releases) - {account_id for account_id, _ in ordered}:
        raise ValueError("a release names an account the entry does not move")
    params = dict(params or {})
    if params and not description:
        description = entry_english(params)
    entry = JournalEntry(
        reference=reference,
        kind=kind,
        currency=currency,
        description=description,
        params=params,
    )
    if not insert_unless_exists(entry, ["reference"]):
        existing = JournalEntry.objects.get(reference=reference)
        if releases or not _same_movement(existing, ordered):
            raise ReferenceConflict(reference=reference)
        return existing
    seen_versions = seen_versions or {}
    postings = []
    for account_id, amount in ordered:
        balance_after, version = _move(
            account_id,
            amount,
            currency,
            seen_versions.get(account_id),
            release=releases.get(account_id, 0),
        )
        postings.append(
            Posting(
                entry=entry,
                account_id=account_id,
                amount=amount,
                balance_after=balance_after,
                version=version,
            )
        )
    Posting.objects.bulk_create(postings)
    return entry


def external_code(currency: str) -> str:
    return f"external-{currency.lower()}"


def external_account(*, currency: str) -> Account:
    """The outside world for `currency`: the source of deposits."""
    account, _ = Account.objects.get_or_create(
        code=external_code(currency),
        defaults={"kind": Account.Kind.EXTERNAL, "currency": currency},
    )
    return account


def external_provider_account(*, currency: str, spread_by: str) -> Account:
    """The outside world's account a provider payment moves: what its settlement
    debits (and what a refund it gave back at once credits).

    With `MERCHANT_SUB_ACCOUNTS` = N (2 or more), one of the outside world's N
    sub-accounts (`external-cny-sub-3`), chosen by a hash of `spread_by` as
    `merchant_credit_account` chooses the merchant's: concurrent settlements then
    lock one of N rows on either side, not the one `external` row. Swept into the
    external account like a merchant's. Otherwise the external account itself."""
    return _spread_account(
        external_account, external_code(currency), currency, spread_by
    )


def merchant_code(currency: str) -> str:
    return f"merchant-{currency.lower()}"


def sub_account_code(code: str, number: int) -> str:
    return f"{code}-sub-{number}"


def merchant_sub_code(currency: str, number: int) -> str:
    return sub_account_code(merchant_code(currency), number)


def merchant_account(*, currency: str) -> Account:
    """The shop's own account for `currency`: where customers' payments land."""
    account, _ = Account.objects.get_or_create(
        code=merchant_code(currency),
        defaults={"kind": Account.Kind.MERCHANT, "currency": currency},
    )
    return account


def merchant_credit_account(*, currency: str, spread_by: str) -> Account:
    """The account a payment to the merchant credits.

    With `MERCHANT_SUB_ACCOUNTS` = N (2 or more), one of the merchant's N
    sub-accounts, chosen by a hash of `spread_by` (the payment's ledger reference):
    concurrent payments then queue on N row locks instead of the merchant's one,
    and `merchant_sweep` moves what they collect up into the merchant's account.
    Otherwise, or when that sub-account or the merchant's account is not active
    (frozen or closed by staff), the merchant's account itself, which then takes
    or refuses the payment as it always would. Either way one lookup by code; a
    sub-account is created by the first payment that lands on it.
    """
    return _spread_account(
        merchant_account, merchant_code(currency), currency, spread_by
    )


def _spread_account(
    main: Callable[..., Account], main_code: str, currency: str, spread_by: str
) -> Account:
    """`main(currency=...)` (whose code is `main_code`), or with
    `MERCHANT_SUB_ACCOUNTS` >= 2 its sub-account that `spread_by` hashes to, made
    on first use: see `merchant_credit_account`."""
    count = settings.MERCHANT_SUB_ACCOUNTS
    if count < 2:
        return main(currency=currency)
    code = sub_account_code(main_code, zlib.crc32(spread_by.encode()) % count)
    account = Account.objects.select_related("parent").filter(code=code).first()
    if account is None:
        family = main(currency=currency)
        if _key_shared_status(family.pk) != Account.Status.ACTIVE:
            return family
        account, _ = Account.objects.select_related("parent").get_or_create(
            code=code,
            defaults={"kind": family.kind, "currency": currency, "parent": family},
        )
    parent = account.parent
    if parent is None:  # pragma: no cover - sub-account codes are the ledger's own
        return main(currency=currency)
    active = Account.Status.ACTIVE
    return account if account.status == parent.status == active else parent


def _key_shared_status(account_id: int) -> str:
    """The account's status now, its row held `FOR KEY SHARE` until the caller's
    transaction ends: what a new sub-account's foreign key would take only at
    COMMIT (Django's are deferred), taken before the sub-account is made. Closing
    the merchant locks it `FOR UPDATE`, which conflicts: the close waits for this
    payment and then sees its money, or goes first and this payment sees the
    merchant closed. Payments crediting the merchant (`FOR NO KEY UPDATE`) do not
    conflict with it. (SQLite runs one writer at a time.)"""
    if connection.vendor != "postgresql":
        return Account.objects.values_list("status", flat=True).get(pk=account_id)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT status FROM ledger_account WHERE id = %s FOR KEY SHARE",
            [account_id],
        )
        return cursor.fetchone()[0]


def sweep_reference(sub_account: Account) -> str:
    """One sweep per state of a sub-account: its id and the version swept."""
    return f"sweep:{sub_account.pk}:{sub_account.version}"


@transaction.atomic(savepoint=False)
def merchant_sweep(*, account_id: int) -> JournalEntry | None:
    """Move a sub-account's whole balance up into its parent (the merchant's
    account, or the outside world's), once; None when it holds nothing. An outside
    sub-account's balance is mostly below zero: the sweep then debits the parent.

    One journal entry (sub-account -> parent), in the caller's transaction. Both
    rows are locked first, in primary-key order as every service takes them (a
    payment crediting the sub-account waits the moment this takes), so the amount
    posted is the balance; the entry's reference names the version swept
    (`sweep:<id>:<version>`), so a second sweep of the same state (a redelivered
    task, a second worker) finds nothing left or the reference taken.
    """
    parent_id = Account.objects.values_list("parent_id", flat=True).get(pk=account_id)
    if parent_id is None:
        raise ValueError(f"account {account_id} is not a sub-account")
    # FOR NO KEY UPDATE, as the UPDATEs take: a row being swept still lets other
    # transactions commit rows that point at it (a new sub-account, a posting).
    rows = Account.objects.select_for_update(no_key=True).filter(
        pk__in=(account_id, parent_id)
    )
    sub = {row.pk: row for row in rows.order_by("pk")}[account_id]
    if sub.balance == 0:
        return None
    return ledger_post(
        reference=sweep_reference(sub),
        kind=JournalEntry.Kind.TRANSFER,
        currency=sub.currency,
        legs=[(sub.pk, -sub.balance), (parent_id, sub.balance)],
        params=entry_params("merchant_sweep", account=sub.code or str(sub.pk)),
        seen_versions={sub.pk: sub.version},
    )


@transaction.atomic(savepoint=False)
def merchant_give_back(
    *,
    entry_id: int,
    destination_id: int,
    amount: int,
    currency: str,
    reference: str,
    kind: str,
    params: Mapping[str, str] | None = None,
) -> JournalEntry:
    """Move `amount` of what entry `entry_id` credited to the merchant (a payment)
    on to `destination_id`, once per reference: a refund.

    Credited to the merchant's account: from there. Credited to a sub-account:
    from what the sub-account still has, and the rest from the merchant's account,
    where sweeps moved it; one entry of up to three postings. The three rows are
    locked first, in primary-key order as every service takes them, so the split is
    taken from balances nobody moves meanwhile. A merchant account that is not
    active gives nothing back from its sub-accounts either (`AccountNotActive`):
    they are its money.
    """
    if amount <= 0:
        raise ValueError("a refund moves a positive amount")
    credited = (
        Account.objects.filter(postings__entry_id=entry_id, postings__amount__gt=0)
        .values_list("pk", "parent_id")
        .first()
    )
    if credited is None:
        raise ValueError(f"journal entry {entry_id} credited no account")
    source_id, parent_id = credited
    if parent_id is None:
        return ledger_transfer(
            source_id=source_id,
            destination_id=destination_id,
            amount=amount,
            currency=currency,
            reference=reference,
            kind=kind,
            params=params,
        )
    rows = Account.objects.select_for_update(no_key=True).filter(
        pk__in=(source_id, parent_id, destination_id)
    )
    locked = {row.pk: row for row in rows.order_by("pk")}
    sub, parent = locked[source_id], locked[parent_id]
    from_sub = 0
    if sub.status == parent.status == Account.Status.ACTIVE:
        from_sub = max(0, min(sub.available, amount))
    legs = [
        (destination_id, amount),
        (sub.pk, -from_sub),
        (parent_id, from_sub - amount),
    ]
    return ledger_post(
        reference=reference,
        kind=kind,
        currency=currency,
        legs=[(account_id, moved) for account_id, moved in legs if moved],
        params=params,
    )


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
    *,
    account_id: int,
    amount: int,
    reference: str,
    description: str = "",
    params: Mapping[str, str] | None = None,
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
        params=params,
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
    params: Mapping[str, str] | None = None,
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
        params=params,
        seen_versions={source_id: seen_version} if seen_version is not None else None,
    )


@transaction.atomic(savepoint=False)
def hold_authorize(
    *, account_id: int, amount: int, reference: str, expires_in: timedelta
) -> Hold:
    """Reserve `amount` of the account's available money for `expires_in`, once
    per reference.

    Its `expires_at` is stamped by the database's clock, which also decides when
    it has expired (`_hold_close`): a host whose clock ran slow made holds that
    had expired before they were made.

    The hold row is inserted first, so its unique `reference` is claimed before
    `held` moves: a replay finds the hold and gets it back. Then one conditional
    UPDATE, `held = held + :amt WHERE id = :id AND balance - held >= :amt AND
    status = 'active'`; zero rows raises `InsufficientFunds` or `AccountNotActive`
    and the caller's transaction, hold row included, rolls back. The same UPDATE
    bumps the account's `version`, as every change of what a read of it shows
    does (`held`, `available`): a caller acting on the version it saw
    (`seen_version`) sees that the money available moved.
    """
    if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
        raise ValueError("a hold is a positive integer of minor units")
    hold = Hold(account_id=account_id, amount=amount, reference=reference)
    if not insert_unless_exists(hold, ["reference"], clock={"expires_at": expires_in}):
        existing = Hold.objects.get(reference=reference)
        if (existing.account_id, existing.amount) != (account_id, amount):
            raise ReferenceConflict(reference=reference)
        return existing
    held = Account.objects.filter(
        pk=account_id,
        status=Account.Status.ACTIVE,
        balance__gte=F("held") + amount,
    ).update(held=F("held") + amount, version=F("version") + 1)
    if not held:
        account = Account.objects.filter(pk=account_id).first()
        currency = account.currency if account else ""
        raise _refusal(account_id, -amount, currency, None)
    return hold


# How a release compares the hold's `expires_at` with now (`{now}`): a capture only
# before it, the expiry only after it, a void whenever.
_BEFORE_EXPIRY = " AND expires_at > {now}"
_PAST_EXPIRY = " AND expires_at <= {now}"


def _hold_close(hold_id: int, status: str, expiry: str = "") -> Hold:
    """Take an active hold to `status`; the caller releases its amount from `held`.

    One conditional `UPDATE ... WHERE status = 'active' RETURNING ...` (plus the
    `expiry` condition): of two closes racing, the second finds no row and raises
    `HoldNotActive`; only the winner goes on to lower `held`.
    """
    now = timezone.now()
    # Whether the hold has expired is the database's clock's to say: hosts' clocks
    # differ, and a beat host running fast expired holds before their time.
    postgres = connection.vendor == "postgresql"
    expiry = expiry.format(now="CLOCK_TIMESTAMP()" if postgres else "%s")
    sql = (
        f"UPDATE {Hold._meta.db_table} SET status = %s, released_at = %s "  # noqa: S608
        f"WHERE id = %s AND status = %s{expiry} "
        "RETURNING account_id, amount, reference, expires_at, created_at"
    )
    params: list = [status, now, hold_id, Hold.Status.ACTIVE]
    if expiry and not postgres:  # SQLite: this host's clock is the database's
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
    `available` (`held = held - :amt`, bumping the account's `version`)."""
    hold = _hold_close(hold_id, status, expiry)
    released = Account.objects.filter(pk=hold.account_id, held__gte=hold.amount).update(
        held=F("held") - hold.amount, version=F("version") + 1
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
def wallet_top_up(
    *, account_id: int, at_least: int, active_only: bool = False
) -> JournalEntry | None:
    """Deposit whatever brings the wallet up to `at_least`; nothing if it has that.

    The row is locked while we decide, and the deposit's reference names the version
    we decided on, so two concurrent top-ups cannot both deposit the difference.
    `active_only` refuses a deposit into a wallet that is not active
    (`AccountNotActive`), decided under the same lock, so a freeze cannot slip in
    between: an operator's top-up of a frozen wallet is a mistake to report, where
    a credit to it (a refund) is not. A wallet that holds the amount already needs
    no deposit and is not refused: running the same top-up again changes nothing.
    """
    account = Account.objects.select_for_update().get(pk=account_id)
    missing = at_least - account.balance
    if missing <= 0:
        return None
    if active_only and account.status != Account.Status.ACTIVE:
        raise AccountNotActive(f"Account {account_id} is {account.status}.")
    return ledger_deposit(
        account_id=account.pk,
        amount=missing,
        reference=f"top-up:{account.pk}:v{account.version}",
        params=entry_params("top_up"),
    )


# The kinds of account that may have sub-accounts (`MERCHANT_SUB_ACCOUNTS`).
_SPREAD_KINDS = (Account.Kind.MERCHANT, Account.Kind.EXTERNAL)

# The states of a merchant's sub-accounts that follow it through each edge.
_SUB_ACCOUNTS_FOLLOW = {
    "freeze": [Account.Status.ACTIVE],
    "unfreeze": [Account.Status.FROZEN],
    "close": [Account.Status.ACTIVE, Account.Status.FROZEN],
}


# What an account is once it took each edge, for a refusal's detail ("it cannot be
# frozen"; the edge's name is a verb).
_TRANSITION_DONE = {"freeze": "frozen", "unfreeze": "unfrozen", "close": "closed"}


def _account_transition(
    account_id: int, name: str, seen_status_version: int | None
) -> Account:
    """Take the transition `name` under the account's row lock, and bump its
    `version` and `status_version`.

    `seen_status_version` is the account's `status_version` as the caller showed it
    to its user (the admin's confirmation page): if any transition happened since,
    even one and back (frozen, then active again), nothing happens and
    `StaleVersion` is raised, so a second press of the same button, or two staff
    members at once, change the account once. Money moving meanwhile does not stop
    it (every posting bumps `version`: an account in use, or being drained, could
    never be frozen if that had to hold still). An edge the state machine does not
    have (freezing a frozen account) raises `AccountTransitionRefused`.
    """
    with transaction.atomic(savepoint=False):
        # FOR NO KEY UPDATE: the status is no key, and a transaction committing a
        # row that points at this one (a new sub-account) must not wait on it. A
        # close, though, must see a sub-account being made: see `_lock_to_close`.
        if name == "close":
            account = _lock_to_close(account_id)
        else:
            account = Account.objects.select_for_update(no_key=True).get(pk=account_id)
        seen = seen_status_version
        if seen is not None and account.status_version != seen:
            raise StaleVersion(account_id=account_id, version=account.status_version)
        if name == "close":
            if account.parent_id is not None:
                raise SubAccountClosesWithMerchant(
                    f"Account {account_id} is a merchant sub-account: it closes "
                    "with its merchant.",
                    status_now=account.status,
                )
            _refuse_unless_empty(account)
        try:
            getattr(account, name)()
        except TransitionNotAllowed:
            raise AccountTransitionRefused(
                f"Account {account_id} is {account.status}: it cannot be "
                f"{_TRANSITION_DONE[name]}.",
                status_now=account.status,
            ) from None
        account.version += 1
        account.status_version += 1
        account.save(update_fields=["status", "version", "status_version"])
        if account.kind in _SPREAD_KINDS and account.parent_id is None:
            # Sub-accounts are their parent's money: they take the same edge
            # (the state machine's, from the states it allows), in this
            # transaction. A payment already crediting one is waited for; one that
            # comes after finds it frozen or closed, as it would have found the
            # merchant's own row.
            Account.objects.filter(
                parent=account, status__in=_SUB_ACCOUNTS_FOLLOW[name]
            ).update(
                status=account.status,
                version=F("version") + 1,
                status_version=F("status_version") + 1,
            )
    return account


# How long a close tries for its account's row lock before it says the account is
# busy, and how long it rests between tries.
CLOSE_LOCK_SECONDS = 5.0
CLOSE_LOCK_REST = 0.05
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's answer to a NOWAIT lock it cannot have


def _lock_to_close(account_id: int) -> Account:
    """The account, locked `FOR UPDATE` for its close; `AccountBusy` if that lock
    cannot be had within `CLOSE_LOCK_SECONDS`.

    `FOR UPDATE` conflicts with the `FOR KEY SHARE` a payment takes on a merchant
    before it makes a sub-account (`_key_shared_status`): the close then sees the
    new sub-account and its money, or the payment sees the merchant closed. But it
    never waits in the row's queue (`NOWAIT`, tried again after a rest): a waiting
    `FOR UPDATE` holds the row's place in line, and a refund or sweep holding a
    wallet would queue behind it while the payment it waits for needs that wallet
    next: a deadlock. Trying again instead, the close only ever waits for nothing.
    """
    deadline = time.monotonic() + CLOSE_LOCK_SECONDS
    while True:
        try:
            with transaction.atomic():  # a savepoint: a refused try leaves no trace
                return Account.objects.select_for_update(nowait=True).get(pk=account_id)
        except OperationalError as refused:
            if getattr(refused.__cause__, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                raise
            if time.monotonic() >= deadline:
                raise AccountBusy(
                    f"Account {account_id} is busy (money is moving through it); "
                    "try closing it again in a moment."
                ) from None
            time.sleep(CLOSE_LOCK_REST)


def _refuse_unless_empty(account: Account) -> None:
    """Raise `AccountNotEmpty` if the account, or a sub-account of it, holds or
    reserves money: closed, it would keep that money for good (nothing leaves a
    closed account). The sub-accounts are locked first, unfiltered, so a payment
    crediting one now is waited for and its money seen (a filter on the balance
    would pass over a row whose credit has not committed yet)."""
    rows = [account]
    if account.kind in _SPREAD_KINDS and account.parent_id is None:
        rows += (
            Account.objects.select_for_update(no_key=True)
            .filter(parent=account)
            .order_by("pk")
        )
    for row in rows:
        if row.balance or row.held:
            raise AccountNotEmpty(
                account_id=row.pk,
                balance=row.balance,
                held=row.held,
                currency=row.currency,
            )


def account_freeze(
    *, account_id: int, seen_status_version: int | None = None
) -> Account:
    """Freeze an active account: nothing leaves it, while the ledger's credits
    (a refund, a deposit, staff's credit) still arrive. A transfer is refused
    whichever side is frozen: the contract keeps transfers between active wallets."""
    return _account_transition(account_id, "freeze", seen_status_version)


def account_unfreeze(
    *, account_id: int, seen_status_version: int | None = None
) -> Account:
    """Make a frozen account active again."""
    return _account_transition(account_id, "unfreeze", seen_status_version)


def account_close(
    *, account_id: int, seen_status_version: int | None = None
) -> Account:
    """Close an account for good; nothing moves in or out afterwards."""
    return _account_transition(account_id, "close", seen_status_version)


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


# Two int4 keys: a lock space of its own, apart from the single-bigint advisory locks
# the idempotency engine takes on keys.
_SEALER_LOCK = (0x1ED6E2, 1)


@transaction.atomic(savepoint=False)
def journal_seal(*, batch_size: int = 1000) -> int:
    """Seal every committed, unsealed journal entry into the hash chain; return how
    many were sealed.

    One sealer at a time: a transaction-scoped advisory lock, so a second sealer
    waits and then finds nothing left. Entries are sealed in the order we find them
    (by id among those visible now); one that commits later, with a lower id, is
    sealed by the next run with a higher `seq`. Writers never wait for this: an entry
    is inserted without touching the chain. Runs under beat every minute and at the
    start of `check_ledger`.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", _SEALER_LOCK)
    head = JournalSeal.objects.order_by("-seq").first()
    seq, prev_hash = (head.seq, head.hash) if head else (0, GENESIS)
    sealed = 0
    while True:
        entries = list(
            JournalEntry.objects.filter(seal__isnull=True)
            .order_by("pk")
            .prefetch_related("postings")[:batch_size]
        )
        if not entries:
            return sealed
        seals = []
        for entry in entries:
            seq += 1
            digest = chain_hash(prev_hash, entry, entry.postings.all())
            seals.append(
                JournalSeal(entry=entry, seq=seq, prev_hash=prev_hash, hash=digest)
            )
            prev_hash = digest
        JournalSeal.objects.bulk_create(seals)
        sealed += len(seals)


@dataclass(frozen=True)
class TransferItem:
    """One transfer asked for: to whom (a username), how much, in what currency."""

    to: str
    amount: int
    currency: str
    description: str = ""


def _credit_many(
    credits: Mapping[int, tuple[int, int]],
) -> dict[int, tuple[int, int]]:
    """Credit several active accounts in one conditional UPDATE ... FROM a list of
    (id, amount, postings) rows; `credits` maps account id -> (amount, postings).
    Answer each account's balance and version after it; an account the guard
    refused is missing from the answer."""
    ordered = sorted(credits.items())
    params: list[Any]
    if connection.vendor == "postgresql":
        # Three arrays: one statement text whatever the batch's size, which the
        # driver parses once (a text with 300 placeholders costs it over a ms each
        # time).
        rows = "SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[])"
        params = [
            [pk for pk, _ in ordered],
            [amount for _, (amount, _) in ordered],
            [n for _, (_, n) in ordered],
        ]
    else:
        rows = "VALUES " + ", ".join(
            ["(CAST(%s AS BIGINT), CAST(%s AS BIGINT), CAST(%s AS BIGINT))"]
            * len(ordered)
        )
        params = [value for pk, (amount, n) in ordered for value in (pk, amount, n)]
    statement = (
        f"WITH credit (id, amount, n) AS ({rows}) "  # noqa: S608 (placeholders only)
        "UPDATE ledger_account SET balance = ledger_account.balance + credit.amount, "
        "version = ledger_account.version + credit.n FROM credit "
        "WHERE ledger_account.id = credit.id AND ledger_account.status = %s "
        "RETURNING ledger_account.id, ledger_account.balance, ledger_account.version"
    )
    with connection.cursor() as cursor:
        cursor.execute(statement, [*params, Account.Status.ACTIVE])
        return {pk: (balance, version) for pk, balance, version in cursor.fetchall()}


def _transfer_refusal(
    item: TransferItem,
    *,
    sender: User,
    recipients: Mapping[str, User],
    wallets: Mapping[tuple[int, str], Account],
    available: dict[int, int],
) -> DomainError | None:
    """Why `item` cannot be made, or None (then its amount is set aside)."""
    if item.amount <= 0:
        return InvalidTransfer("A transfer moves a positive amount.")
    if item.to == sender.get_username():
        return InvalidTransfer("A transfer goes to someone else.")
    recipient = recipients.get(item.to)
    if recipient is None:
        return RecipientUnknown(f"No customer is called {item.to!r}.")
    source = wallets.get((sender.pk, item.currency))
    destination = wallets.get((recipient.pk, item.currency))
    if source is None and item.currency == settings.LEDGER_DEFAULT_CURRENCY:
        # Not made yet (`accounts/me` makes it): the empty wallet it would show.
        return InsufficientFunds(balance=0, held=0, available=0, amount=item.amount)
    if source is None or destination is None:
        whose = "You hold" if source is None else f"{item.to} holds"
        return CurrencyMismatch(f"{whose} no {item.currency} wallet.")
    for wallet in (source, destination):
        if wallet.status != Account.Status.ACTIVE:
            return AccountNotActive(f"Account {wallet.pk} is {wallet.status}.")
    if item.amount > available[source.pk]:
        return InsufficientFunds(  # what is left for it after the items before
            balance=source.balance,
            held=source.held,
            available=available[source.pk],
            amount=item.amount,
        )
    available[source.pk] -= item.amount
    return None


def _transfer_description(sender: str, recipient: str) -> str:
    """The entry's own description of a transfer sent without one, cut to fit its
    column: two usernames may be 150 characters each."""
    text = f"Transfer from {sender} to {recipient}"
    return text[: JournalEntry._meta.get_field("description").max_length]


@transaction.atomic(savepoint=False)
def transfer_batch_create(
    *, sender: User, items: Sequence[TransferItem]
) -> list[Transfer]:
    """Send money from the sender's wallets to each item's recipient: all or nothing;
    return the transfers made, in the items' order (they share one batch).

    The transaction's story (the caller's transaction: under the idempotent endpoint
    the effect and the finished key commit together). Read the recipients (one
    query). Lock every wallet involved in one statement, in id order, so two batches
    in opposite directions take their locks in the same order and never deadlock.
    Check every item against the locked rows, collecting each refusal, so all refused
    items are named while nothing has moved (`TransferBatchRefused`). Then write: the
    batch, the journal entries (one per item), one debit per sender wallet (the
    conditional UPDATE every debit uses, its guard the last word), one UPDATE
    crediting every recipient, then the postings (with the balance and version after
    each, derived from the UPDATEs' RETURNING) and the transfers. Entries, postings
    and transfers each go in one INSERT of arrays (`insert_many`): the number of
    statements, and their text, do not grow with the number of items.
    """
    usernames = {item.to for item in items}
    default = settings.LEDGER_DEFAULT_CURRENCY
    recipients = {
        user.get_username(): user
        # Only customers receive: staff and deactivated users are nobody to send to
        # (and a refusal of theirs must not tell that they exist).
        for user in User.objects.filter(
            username__in=usernames, is_active=True, is_staff=False
        )
        .exclude(pk=sender.pk)
        .annotate(
            has_default_wallet=Exists(
                Account.objects.filter(
                    owner=OuterRef("pk"), kind=Account.Kind.WALLET, currency=default
                )
            )
        )
    }
    # Every customer has a wallet in the default currency, made when the API first
    # shows it (`accounts/me`); one who never looked receives into it all the same.
    # Made before any row is locked, in username order: a wallet being made
    # elsewhere is waited for while this holds no lock, and two transfers making
    # the same wallets never wait for each other in a circle. (A refusal rolls it
    # back with the rest.)
    for username in sorted({item.to for item in items if item.currency == default}):
        user = recipients.get(username)
        if user is not None and not user.has_default_wallet:  # type: ignore[attr-defined]
            wallet_get_or_create(owner_id=user.pk, currency=default)
    locked = Account.objects.select_for_update().filter(
        owner_id__in=[sender.pk, *(user.pk for user in recipients.values())],
        kind=Account.Kind.WALLET,
        currency__in={item.currency for item in items},
    )
    wallets = {(cast(int, a.owner_id), a.currency): a for a in locked.order_by("pk")}
    available = {a.pk: a.available for a in wallets.values() if a.owner_id == sender.pk}
    refusals = []
    for index, item in enumerate(items):
        refusal = _transfer_refusal(
            item,
            sender=sender,
            recipients=recipients,
            wallets=wallets,
            available=available,
        )
        if refusal is not None:
            refusals.append((index, refusal))
    if refusals:
        raise TransferBatchRefused(refusals)

    batch = TransferBatch.objects.create(sender=sender)
    legs = [
        (
            wallets[(sender.pk, item.currency)],
            wallets[(recipients[item.to].pk, item.currency)],
            item,
        )
        for item in items
    ]
    # Per account: the signed sum it moves by and how many postings it gets.
    moves: dict[int, tuple[int, int]] = defaultdict(lambda: (0, 0))
    for source, destination, item in legs:
        for pk, amount in ((source.pk, -item.amount), (destination.pk, item.amount)):
            total, n = moves[pk]
            moves[pk] = (total + amount, n + 1)
    entries = insert_many(
        [
            JournalEntry(
                reference=f"transfer:{batch.pk}:{index}",
                kind=JournalEntry.Kind.TRANSFER,
                currency=item.currency,
                description=item.description
                or _transfer_description(sender.get_username(), item.to),
            )
            for index, item in enumerate(items)
        ]
    )
    after: dict[int, tuple[int, int]] = {}
    for source in sorted({source for source, _, _ in legs}, key=lambda a: a.pk):
        total, n = moves[source.pk]
        after[source.pk] = _move(source.pk, total, source.currency, None, postings=n)
    credits = {destination.pk: moves[destination.pk] for _, destination, _ in legs}
    after.update(_credit_many(credits))
    for _, destination, item in legs:
        if destination.pk not in after:  # the guard refused: it changed under us
            raise _refusal(destination.pk, item.amount, item.currency, None)
    # Each account's state before the batch, then forward through the items: every
    # posting gets the balance and version it left its account with.
    state = {
        pk: (balance - moves[pk][0], version - moves[pk][1])
        for pk, (balance, version) in after.items()
    }
    postings, transfers = [], []
    for index, ((source, destination, item), entry) in enumerate(
        zip(legs, entries, strict=True)
    ):
        for account, amount in ((source, -item.amount), (destination, item.amount)):
            balance, version = state[account.pk]
            state[account.pk] = (balance + amount, version + 1)
            postings.append(
                Posting(
                    entry_id=entry.pk,
                    account_id=account.pk,
                    amount=amount,
                    balance_after=balance + amount,
                    version=version + 1,
                )
            )
        transfers.append(
            Transfer(
                batch_id=batch.pk,
                index=index,
                entry_id=entry.pk,
                sender=sender,
                recipient=recipients[item.to],
                amount=item.amount,
                currency=item.currency,
                description=item.description,
            )
        )
    insert_many(postings)
    return list(insert_many(transfers))


def transfer_create(*, sender: User, item: TransferItem) -> Transfer:
    """Send one transfer: a batch of one, whose refusal is the item's own error
    (`insufficient_funds`, `recipient_unknown`, ...) rather than a batch's."""
    try:
        [transfer] = transfer_batch_create(sender=sender, items=[item])
    except TransferBatchRefused as refused:
        raise refused.refusals[0][1] from None
    return transfer
