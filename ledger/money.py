"""Money as people read it: minor units and a currency shown as a price.

`format_money(94003, "CNY")` is `¥940.03`; a currency without a symbol of its own is
spelled out (`940.03 CHF`). One function for every screen: the shop's templates (the
`money` filter, `ledger/templatetags/money.py`) and the admin's columns and detail
pages. Integers in, text out: no float ever sees an amount.
"""

from decimal import Decimal

SYMBOLS = {"CNY": "¥", "USD": "$", "EUR": "€", "GBP": "£", "JPY": "¥"}
# ISO 4217 minor-unit exponents that are not 2.
EXPONENTS = {"JPY": 0, "KRW": 0, "BHD": 3, "KWD": 3}


def format_money(amount: int | None, currency: str = "CNY") -> str:
    """Minor units shown as a price: 94003 CNY -> `¥940.03`, -150 USD -> `-$1.50`."""
    if amount is None:
        return ""
    exponent = EXPONENTS.get(currency, 2)
    major = Decimal(abs(amount)).scaleb(-exponent)
    number = f"{major:,.{exponent}f}"
    symbol = SYMBOLS.get(currency)
    text = f"{symbol}{number}" if symbol else f"{number} {currency}"
    return f"-{text}" if amount < 0 else text
