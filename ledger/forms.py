"""Money typed into a web form: as the shop shows it (`12.50`), never in minor units.

One field for every form that takes an amount (the shop's order form, the admin's
credit and product forms), so that they all accept and refuse the same input.
"""

from decimal import Decimal
from typing import Any

from django import forms

# Minor units per major unit: forms take yuan (or dollars) with two decimals.
MINOR_PER_MAJOR = 100


def major_units(minor: int) -> Decimal:
    """1234 -> Decimal("12.34"): what a form shows for an amount in minor units."""
    return (Decimal(minor) / MINOR_PER_MAJOR).quantize(Decimal("0.01"))


def minor_units(major: Decimal) -> int:
    """Decimal("12.34") -> 1234: what a form's amount is stored as."""
    return int(major * MINOR_PER_MAJOR)


class MoneyField(forms.DecimalField):
    """An amount from 0.01 up to `max_minor` minor units, two decimals at most."""

    def __init__(self, *, max_minor: int, **kwargs: Any) -> None:
        largest = major_units(max_minor)
        super().__init__(
            min_value=Decimal("0.01"),
            max_value=largest,
            # As many digits as the largest amount has: the bound is `max_value`'s.
            max_digits=len(largest.as_tuple().digits),
            decimal_places=2,
            widget=forms.NumberInput(
                attrs={"step": "0.01", "min": "0.01", "inputmode": "decimal"}
            ),
            **kwargs,
        )
