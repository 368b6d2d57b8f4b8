"""The one JSON parser of the API: DRF's, with the nesting bound of `jsonparse`."""

from collections.abc import Mapping
from typing import Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError
from rest_framework.utils import json

from idempotency import jsonparse


class JSONParser(parsers.JSONParser):
    """Parse a JSON body; one nested too deeply is malformed JSON (400) like any
    other, instead of a RecursionError (500)."""

    def parse(
        self,
        stream: Any,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        # DRF's own choice of charset, which refuses codecs that are not text.
        encoding = parsers.get_encoding(parser_context or {})  # type: ignore[attr-defined]
        try:
            text = stream.read().decode(encoding)
            parse_constant = json.strict_constant if self.strict else None
            return jsonparse.loads(text, parse_constant=parse_constant)
        except ValueError as exc:  # UnicodeDecodeError and TooDeep are ValueErrors
            raise ParseError(f"JSON parse error - {exc}") from None
