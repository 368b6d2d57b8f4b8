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


class StrictIntegerField(serializers.IntegerField):
    default_error_messages = {"invalid": "A JSON integer is required."}

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictCharField(serializers.CharField):
    default_error_messages = {"invalid": "A JSON string is required."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        if "\x00" in data:
            self.fail("invalid")
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


class StrictInputSerializer(serializers.Serializer):
    """An input serializer that also refuses fields it does not know."""

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError(
                {name: ["Unknown field."] for name in unknown}
            )
        return attrs
