"""The default currency, refused at start-up unless the ledger supports it."""

from typing import Any

from django.conf import settings
from django.core import checks

from .currencies import SUPPORTED_CURRENCIES, currency_supported


@checks.register()
def default_currency(**kwargs: Any) -> list[checks.CheckMessage]:
    currency = settings.LEDGER_DEFAULT_CURRENCY
    if currency_supported(currency):
        return []
    return [
        checks.Error(
            f"LEDGER_DEFAULT_CURRENCY = {currency!r}: not a currency the ledger "
            "supports; wallets and web orders would be opened in it",
            hint=f"use one of {', '.join(SUPPORTED_CURRENCIES)}",
            id="ledger.E001",
        )
    ]


@checks.register()
def beat_lease(**kwargs: Any) -> list[checks.CheckMessage]:
    """The beat leader renews every third of its lease: under a second leaves no
    time for the round trip, and leadership would flap between beats."""
    if settings.BEAT_LEASE_SECONDS >= 1:
        return []
    return [
        checks.Error(
            f"BEAT_LEASE_SECONDS = {settings.BEAT_LEASE_SECONDS!r}: must be at least "
            "1 second",
            id="ledger.E002",
        )
    ]


@checks.register()
def beat_publish_try(**kwargs: Any) -> list[checks.CheckMessage]:
    """The beat leader starts a try of a send only while its lease has the try and a
    tenth of the lease left: a try as long as that would never be started. (A lease
    under a second is refused on its own, E002.)"""
    lease, try_seconds = settings.BEAT_LEASE_SECONDS, settings.BEAT_PUBLISH_TRY_SECONDS
    if lease < 1 or 0 < try_seconds < lease * 0.9:
        return []
    return [
        checks.Error(
            f"BEAT_PUBLISH_TRY_SECONDS = {try_seconds!r}: must be more than 0 and "
            f"under nine tenths of BEAT_LEASE_SECONDS ({lease!r}), or beat never "
            "sends a task",
            id="ledger.E004",
        )
    ]


# Enough to spread any one merchant's payments over more row locks than there are
# connections to take them.
MERCHANT_SUB_ACCOUNTS_MAX = 1024


@checks.register()
def merchant_sub_accounts(**kwargs: Any) -> list[checks.CheckMessage]:
    count = settings.MERCHANT_SUB_ACCOUNTS
    if 0 <= count <= MERCHANT_SUB_ACCOUNTS_MAX:
        return []
    return [
        checks.Error(
            f"MERCHANT_SUB_ACCOUNTS = {count!r}: must be 0 (none) to "
            f"{MERCHANT_SUB_ACCOUNTS_MAX}",
            id="ledger.E003",
        )
    ]
