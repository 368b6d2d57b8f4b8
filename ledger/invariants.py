"""The invariants `check_ledger` proves, and a registry other apps add theirs to.

A check is a function returning a list of violations (human-readable strings); an empty
list means it holds. Apps register their own in `AppConfig.ready()`, so the orders app
can add "no order paid twice" without the ledger importing it.

A warning check has the same shape but names something an operator must look at that
breaks no invariant (a provider callback parked after failing): it is listed under
`warnings` in the report and never makes it fail.
"""

from collections.abc import Callable

from django.db.models import Count, F, Q, Sum
from django.db.models.functions import Coalesce

from .models import Account, Hold, JournalEntry, Posting

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


def ledger_report() -> dict:
    """Run every registered invariant and warning check; return a JSON-ready
    summary (`ok` is about the invariants only)."""
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
        "checks": [check.__name__ for check in _checks],
        "violations": violations,
        "warning_checks": [check.__name__ for check in _warning_checks],
        "warnings": warnings,
    }
