"""`{{ amount|money:currency }}`: minor units shown as a price, e.g. ¥1,234.50."""

from decimal import Decimal

from django import template

register = template.Library()

SYMBOLS = {"CNY": "¥", "USD": "$", "EUR": "€", "GBP": "£", "JPY": "¥"}
# ISO 4217 minor-unit exponents that are not 2.
EXPONENTS = {"JPY": 0, "KRW": 0, "BHD": 3, "KWD": 3}


@register.filter
def money(amount: int | None, currency: str = "CNY") -> str:
    if amount is None:
        return ""
    exponent = EXPONENTS.get(currency, 2)
    major = Decimal(abs(amount)).scaleb(-exponent)
    number = f"{major:,.{exponent}f}"
    symbol = SYMBOLS.get(currency)
    text = f"{symbol}{number}" if symbol else f"{number} {currency}"
    return f"-{text}" if amount < 0 else text
