"""The currencies the ledger holds money in.

ISO 4217 codes, each with two decimal places (the web UI's form and the `money`
filter count in hundredths). Anything else, however well formed (`ZZZ`), is refused
wherever a currency comes in: the API's input, the settings (a system check).
"""

SUPPORTED_CURRENCIES = ("CNY", "EUR", "USD")


def currency_supported(code: object) -> bool:
    return code in SUPPORTED_CURRENCIES
