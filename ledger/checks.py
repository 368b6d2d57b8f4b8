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
