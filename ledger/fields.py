"""Strict serializer fields: JSON types are checked, never coerced.

DRF's own fields accept `"12"` and `12.0` for an integer and `12` for a string; money
and order numbers must not be guessed from the wrong type, so these refuse them.
"""

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from .currencies import SUPPORTED_CURRENCIES, currency_supported

# Far above any real order, far below BIGINT: an absurd number is a 400, never a 500.
MAX_AMOUNT = 10**15
# The largest integer any field takes: past 64 bits a number is no amount at all.
MAX_INT64 = 2**63 - 1


def storable(text: str) -> bool:
    """Can PostgreSQL text hold it (no NUL, no lone surrogate)?"""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


class StrictIntegerField(serializers.IntegerField):
    default_error_messages = {"invalid": "A JSON integer is required."}

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictCharField(serializers.CharField):
    """A JSON string. An identifier or a code (a currency, a merchant order number,
    a SKU, a username) is taken as sent: one with whitespace around it is refused,
    where DRF's CharField trims it and would take `" CNY"` for `CNY`, another
    request than the one sent. Free text (`free_text=True`: a description, a
    reason) is trimmed as DRF does. Another party's own identifier (`opaque=True`:
    a provider's event id, what a callback names) is neither: it is kept as sent,
    whatever its form, and matches what it matches."""

    default_error_messages = {
        "invalid": "A JSON string is required.",
        "nul": "Text may not contain NUL characters (\\u0000).",
        "spaces": "Remove the whitespace around the value: it is taken as sent.",
    }

    def __init__(
        self, *, free_text: bool = False, opaque: bool = False, **kwargs: Any
    ) -> None:
        self.opaque = opaque
        super().__init__(trim_whitespace=free_text, **kwargs)

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        if "\x00" in data:
            self.fail("nul")
        if not (self.trim_whitespace or self.opaque) and data != data.strip():
            self.fail("spaces")
        return super().to_internal_value(data)


@extend_schema_field({"type": "string", "enum": list(SUPPORTED_CURRENCIES)})
class CurrencyField(StrictCharField):
    """An ISO 4217 code the ledger supports; any other (`ZZZ`) names this field."""

    default_error_messages = {
        "unsupported": (
            "Not a currency the ledger supports; use one of "
            f"{', '.join(SUPPORTED_CURRENCIES)}."
        )
    }

    def to_internal_value(self, data: Any) -> str:
        code = super().to_internal_value(data)
        if not currency_supported(code):
            self.fail("unsupported")
        return code


class BoundedListField(serializers.ListField):
    """A list whose length is checked before its items. DRF checks `max_length`
    after validating every item, so a megabyte of invalid items (400,000 `1`s)
    cost seconds of CPU and came back as a 33 MB list of errors, one per item."""

    def to_internal_value(self, data: Any) -> list:
        limit = self.max_length
        if isinstance(data, list) and limit is not None and len(data) > limit:
            self.fail("max_length", max_length=limit)
        return super().to_internal_value(data)


# How many unknown fields a refusal names (a body may hold tens of thousands).
UNKNOWN_NAMED = 10


def refuse_unknown(known: Any, given: Any) -> None:
    """A 400 naming the fields in `given` that are not in `known`, the first
    `UNKNOWN_NAMED` of them by name."""
    unknown = sorted(set(given) - set(known))
    if not unknown:
        return
    errors: dict[str, list[str]] = {
        name: ["Unknown field."] for name in unknown[:UNKNOWN_NAMED]
    }
    if len(unknown) > UNKNOWN_NAMED:
        # (after "Unknown field." if one of the named is called that, not instead)
        errors.setdefault("non_field_errors", []).append(
            f"{len(unknown)} unknown fields; the first {UNKNOWN_NAMED} are named."
        )
    raise serializers.ValidationError(errors)


class StrictInputSerializer(serializers.Serializer):
    """An input serializer that also refuses fields it does not know."""

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        refuse_unknown(self.fields, self.initial_data)
        return attrs


class StrictNestedSerializer(serializers.Serializer):
    """A nested input object (a list's item) that refuses keys it does not know."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            refuse_unknown(self.fields, data)
        return super().to_internal_value(data)
