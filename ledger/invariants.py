"""The invariants `check_ledger` proves, and a registry other apps add theirs to.

A check is a function returning a list of violations (human-readable strings); an empty
list means it holds. Apps register their own in `AppConfig.ready()`, so the orders app
can add "no order paid twice" without the ledger importing it.

A warning check has the same shape but names something an operator must look at that
breaks no invariant (a provider callback parked after failing): it is listed under
`warnings` in the report and never makes it fail.
"""

from collections import defaultdict
from collections.abc import Callable

from django.db import transaction
from django.db.models import Count, F, OuterRef, Q, Subquery, Sum
from django.db.models.functions import Coalesce

from .journal import GENESIS, chain_hash
from .models import Account, Hold, JournalEntry, JournalSeal, Posting
from .services import journal_seal

Check = Callable[[], list[str]]
_checks: list[Check] = []
_warning_checks: list[Check] = []


def invariant(check: Check) -> Check:
    if check not in _checks:
        _checks.append(check)
    return check


def warning_check(check: Check) -> Check:
    if check not in _warning_checks:
        _warning_checks.append(check)
    return check


@invariant
def entries_balance() -> list[str]:
    unbalanced = (
        JournalEntry.objects.annotate(
            total=Coalesce(Sum("postings__amount"), 0), legs=Count("postings")
        )
        .filter(~Q(total=0) | Q(legs__lt=2))
        .values_list("reference", "total", "legs")
    )
    return [
        f"journal entry {ref!r} does not balance: {legs} postings sum to {total}"
        for ref, total, legs in unbalanced
    ]


@invariant
def balances_match_postings() -> list[str]:
    drifted = (
        Account.objects.annotate(posted=Coalesce(Sum("postings__amount"), 0))
        .exclude(balance=F("posted"))
        .values_list("pk", "balance", "posted")
    )
    return [
        f"account {pk} balance {balance} != sum of its postings {posted}"
        for pk, balance, posted in drifted
    ]


@invariant
def no_negative_balances() -> list[str]:
    negative = (
        Account.objects.filter(balance__lt=0)
        .exclude(kind=Account.Kind.EXTERNAL)
        .values_list("pk", "balance")
    )
    return [f"account {pk} is below zero: {balance}" for pk, balance in negative]


@invariant
def money_is_conserved() -> list[str]:
    totals = Account.objects.values("currency").annotate(total=Sum("balance"))
    return [
        f"{row['currency']} balances sum to {row['total']}, not 0"
        for row in totals
        if row["total"] != 0
    ]


@invariant
def postings_explain_balances() -> list[str]:
    """Each account's latest posting says the balance the account has now."""
    latest = Posting.objects.filter(account=OuterRef("pk")).order_by("-id")
    drifted = (
        Account.objects.annotate(after=Subquery(latest.values("balance_after")[:1]))
        .filter(after__isnull=False)
        .exclude(balance=F("after"))
        .values_list("pk", "balance", "after")
    )
    return [
        f"account {pk} balance {balance} != its latest posting's balance_after {after}"
        for pk, balance, after in drifted
    ]


@invariant
def held_matches_active_holds() -> list[str]:
    """Each account's `held` is the sum of its active holds."""
    drifted = (
        Account.objects.annotate(
            holding=Coalesce(
                Sum("holds__amount", filter=Q(holds__status=Hold.Status.ACTIVE)), 0
            )
        )
        .exclude(held=F("holding"))
        .values_list("pk", "held", "holding")
    )
    return [
        f"account {pk} held {held} != sum of its active holds {holding}"
        for pk, held, holding in drifted
    ]


@invariant
def journal_chain_intact(chunk: int = 2000) -> list[str]:
    """Recompute the hash chain over the sealed entries as they are now.

    Each seal must follow the previous one (`seq` without gaps, `prev_hash` = the
    previous seal's hash), and its hash must be what its entry and postings hash to
    today. A row edited behind the application's back changes that hash; an entry
    deleted leaves its seal pointing at nothing (the seal's reference to it has no
    database constraint, for this). Each finding names the entry. The chain goes on
    from the stored hash, so one tampered entry does not taint the ones after it.
    """
    violations: list[str] = []
    expected_seq, prev_hash = 1, GENESIS
    last_seq = 0
    while True:
        seals = list(
            JournalSeal.objects.filter(seq__gt=last_seq).order_by("seq")[:chunk]
        )
        if not seals:
            return violations
        entry_ids = [seal.entry_id for seal in seals]
        entries = JournalEntry.objects.in_bulk(entry_ids)
        postings: dict[int, list[Posting]] = defaultdict(list)
        for posting in Posting.objects.filter(entry_id__in=entry_ids):
            postings[posting.entry_id].append(posting)
        for seal in seals:
            name = f"journal entry {seal.entry_id} (seal #{seal.seq})"
            if seal.seq != expected_seq:
                violations.append(
                    f"journal seals #{expected_seq}..#{seal.seq - 1} are missing "
                    f"before {name}: the chain was cut"
                )
            if seal.prev_hash != prev_hash:
                violations.append(f"{name} does not link to the seal before it")
            entry = entries.get(seal.entry_id)
            if entry is None:
                violations.append(f"{name} is missing: deleted after it was sealed")
            elif chain_hash(seal.prev_hash, entry, postings[entry.pk]) != seal.hash:
                violations.append(
                    f"{name}, reference {entry.reference!r}, was changed after it "
                    "was sealed: its rows no longer hash to the seal"
                )
            expected_seq, prev_hash = seal.seq + 1, seal.hash
        last_seq = seals[-1].seq


def journal_head() -> dict:
    """The chain's head: the last seal's `seq` and `hash` (an operator may note it
    elsewhere, so that even a rewrite of the whole chain would show)."""
    head = JournalSeal.objects.order_by("-seq").first()
    if head is None:
        return {"seq": 0, "hash": GENESIS, "entry": None}
    return {"seq": head.seq, "hash": head.hash, "entry": head.entry_id}


@invariant
def available_not_negative() -> list[str]:
    """No account holds more than it has: `available` = `balance - held` >= 0."""
    short = (
        Account.objects.filter(balance__lt=F("held"))
        .exclude(kind=Account.Kind.EXTERNAL)
        .values_list("pk", "balance", "held")
    )
    return [
        f"account {pk} available is below zero: balance {balance} - held {held}"
        for pk, balance, held in short
    ]


# How a violation names what a sub-account should be, by its kind.
_SUB_ACCOUNT_OF: dict[str, str] = {
    Account.Kind.MERCHANT: "a merchant sub-account of merchant account",
    Account.Kind.EXTERNAL: "an external sub-account of external account",
}


@invariant
def sub_accounts_belong() -> list[str]:
    """A sub-account (MERCHANT_SUB_ACCOUNTS) is a merchant account under a
    merchant's own account of its currency, or an external account under the
    outside world's own account of its currency, and never holds money back."""
    astray = (
        Account.objects.filter(parent__isnull=False)
        .exclude(
            Q(kind__in=list(_SUB_ACCOUNT_OF), held=0)
            & Q(parent__kind=F("kind"), parent__parent__isnull=True)
            & Q(currency=F("parent__currency"))
        )
        .values_list("pk", "kind", "parent_id")
    )
    return [
        f"account {pk} is not "
        f"{_SUB_ACCOUNT_OF.get(kind, 'a sub-account of account')} {parent}"
        for pk, kind, parent in astray
    ]


@warning_check
def sub_accounts_follow_their_parent() -> list[str]:
    """A sub-account left active under a frozen or closed merchant (or outside
    world; created by a payment in the moment staff froze or closed it): its money
    moves only once staff freeze or close it too, or reopen its parent."""
    astray = (
        Account.objects.filter(parent__isnull=False, status=Account.Status.ACTIVE)
        .exclude(parent__status=Account.Status.ACTIVE)
        .values_list("pk", "kind", "parent_id", "parent__status")
    )
    return [
        f"{kind} sub-account {pk} is active under {kind} account {parent}, "
        f"which is {status}"
        for pk, kind, parent, status in astray
    ]


@warning_check
def closed_accounts_hold_nothing() -> list[str]:
    """A closed account that holds money (closed before closing asked for an empty
    account, or a sub-account a payment made in the moment its merchant closed):
    that money can no longer move, and staff must decide what becomes of it."""
    stuck = (
        Account.objects.filter(status=Account.Status.CLOSED)
        .exclude(balance=0, held=0)
        .values_list("pk", "balance", "held", "currency")
    )
    return [
        f"account {pk} is closed but holds {balance} {currency} ({held} on hold)"
        for pk, balance, held, currency in stuck
    ]


def merchants() -> dict:
    """Each merchant account's money, its sub-accounts' included: what it has, and
    how much of that the sub-accounts hold until the next sweep."""
    rows = (
        Account.objects.filter(kind=Account.Kind.MERCHANT, parent__isnull=True)
        .annotate(
            waiting=Coalesce(Sum("sub_accounts__balance"), 0),
            subs=Count("sub_accounts"),
        )
        .order_by("pk")
        .values_list("code", "pk", "currency", "balance", "waiting", "subs")
    )
    return {
        code or str(pk): {
            "currency": currency,
            "balance": balance + waiting,
            "in_sub_accounts": waiting,
            "sub_accounts": subs,
        }
        for code, pk, currency, balance, waiting, subs in rows
    }


def ledger_report() -> dict:
    """Seal what is unsealed, then run every registered invariant and warning
    check; return a JSON-ready summary (`ok` is about the invariants only)."""
    with transaction.atomic():
        sealed = journal_seal()
    violations = [v for check in _checks for v in check()]
    warnings = [w for check in _warning_checks for w in check()]
    totals = {
        row["currency"]: row["total"]
        for row in Account.objects.exclude(kind=Account.Kind.EXTERNAL)
        .values("currency")
        .annotate(total=Sum("balance"))
        .order_by("currency")
    }
    return {
        "ok": not violations,
        "accounts": Account.objects.count(),
        "entries": JournalEntry.objects.count(),
        "postings": Posting.objects.count(),
        "money_inside": totals,
        "merchants": merchants(),
        "journal": {**journal_head(), "sealed_now": sealed},
        "checks": [check.__name__ for check in _checks],
        "violations": violations,
        "warning_checks": [check.__name__ for check in _warning_checks],
        "warnings": warnings,
    }
