"""The strict serializer fields, defined in the ledger (the bottom of the stack) so
its transfer API uses them too; kept importable from here for the orders' APIs, with
the limits of an order placed with items."""

from ledger.fields import (
    MAX_AMOUNT,
    BoundedListField,
    CurrencyField,
    StrictCharField,
    StrictInputSerializer,
    StrictIntegerField,
    StrictNestedSerializer,
)

# An order placed with items: at most this many lines, each of at most this many units.
MAX_ORDER_LINES = 50
MAX_ITEM_QUANTITY = 1000
# One stock movement of staff's (the admin's adjustment, the command's top-up): at most
# this many units either way.
MAX_STOCK_MOVE = 10**9

__all__ = [
    "MAX_AMOUNT",
    "MAX_ITEM_QUANTITY",
    "MAX_ORDER_LINES",
    "MAX_STOCK_MOVE",
    "BoundedListField",
    "CurrencyField",
    "StrictCharField",
    "StrictInputSerializer",
    "StrictIntegerField",
    "StrictNestedSerializer",
]
