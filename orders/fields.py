"""The strict serializer fields, defined in the ledger (the bottom of the stack) so
its transfer API uses them too; kept importable from here for the orders' APIs."""

from ledger.fields import (
    MAX_AMOUNT,
    CurrencyField,
    StrictCharField,
    StrictInputSerializer,
    StrictIntegerField,
)

__all__ = [
    "MAX_AMOUNT",
    "CurrencyField",
    "StrictCharField",
    "StrictInputSerializer",
    "StrictIntegerField",
]
