"""Money typed into a web form: as the shop shows it (`12.50`), never in minor units.

One field for every form that takes an amount (the shop's order form, the admin's
credit and product forms), so that they all accept and refuse the same input; and
numbers of units typed as plainly (the shop's quantities, the admin's stock moves);
and the ids of rows that pages send back.
"""

import re
from decimal import Decimal
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

# Minor units per major unit: forms take yuan (or dollars) with two decimals.
MINOR_PER_MAJOR = 100


def major_units(minor: int) -> Decimal:
    """1234 -> Decimal("12.34"): what a form shows for an amount in minor units."""
    return (Decimal(minor) / MINOR_PER_MAJOR).quantize(Decimal("0.01"))


def minor_units(major: Decimal) -> int:
    """Decimal("12.34") -> 1234: what a form's amount is stored as."""
    return int(major * MINOR_PER_MAJOR)


# Digits as a person types them: Python's own number parsing would also read
# `1e5` (100000), `1_000`, `+5` and digits of other scripts. A minus sign is read, so
# that `-5` gets the field's minimum-value refusal, as `0` does, not "enter a number".
PLAIN_DECIMAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")
# (`3.0` too: a browser's number box sends a whole number as it was typed.)
PLAIN_INTEGER = re.compile(r"-?[0-9]+(?:\.0*)?")


def plain(value: Any, pattern: re.Pattern[str], field: forms.Field) -> Any:
    """`value` if it is empty or written as `pattern` says; else the field's own
    "enter a number" refusal."""
    if value in field.empty_values:
        return value
    if not pattern.fullmatch(str(value).strip()):
        raise ValidationError(field.error_messages["invalid"], code="invalid")
    return value


def row_id(value: str | None) -> int | None:
    """A row's id as a page or a link sends it back (a form field, a query string):
    a positive 64-bit integer in ASCII digits. Anything else names no row (None).
    Length first: `int()` of 4,301 digits raises."""
    if value is None or not (
        0 < len(value) < 20 and value.isascii() and value.isdigit()
    ):
        return None
    number = int(value)
    return number if 0 < number < 2**63 else None


class PlainIntegerField(forms.IntegerField):
    """A whole number in ASCII digits, nothing else (`1e3`, `1_000` are refused)."""

    def to_python(self, value: Any) -> int | None:
        return super().to_python(plain(value, PLAIN_INTEGER, self))


class MoneyField(forms.DecimalField):
    """An amount from 0.01 up to `max_minor` minor units, two decimals at most,
    typed in plain ASCII digits (`12`, `12.5`, `12.50`)."""

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

    # (django-stubs type DecimalField's `to_python` as its base IntegerField's.)
    def to_python(self, value: Any) -> Decimal | None:  # type: ignore[override]
        return super().to_python(plain(value, PLAIN_DECIMAL, self))
