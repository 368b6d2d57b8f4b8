"""The strict serializer fields, defined in the ledger (the bottom of the stack) so
its transfer API uses them too; kept importable from here for the orders' APIs, with
the limits of an order placed with items."""

from ledger.fields import (
    MAX_AMOUNT,
    CurrencyField,
    StrictCharField,
    StrictInputSerializer,
    StrictIntegerField,
    StrictNestedSerializer,
)

# An order placed with items: at most this many lines, each of at most this many units.
MAX_ORDER_LINES = 50
MAX_ITEM_QUANTITY = 1000

__all__ = [
    "MAX_AMOUNT",
    "MAX_ITEM_QUANTITY",
    "MAX_ORDER_LINES",
    "CurrencyField",
    "StrictCharField",
    "StrictInputSerializer",
    "StrictIntegerField",
    "StrictNestedSerializer",
]
