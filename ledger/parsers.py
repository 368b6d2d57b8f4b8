"""The one JSON parser of the API: DRF's, with the nesting bound of `jsonparse`."""

import codecs
from collections.abc import Mapping
from typing import Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError, UnsupportedMediaType
from rest_framework.utils import json

from idempotency import jsonparse

# JSON exchanged between systems is UTF-8 (RFC 8259, 8.1); ASCII is a part of it.
JSON_CHARSETS = frozenset({"utf-8", "ascii"})


class JSONParser(parsers.JSONParser):
    """Parse a JSON body; one nested too deeply is malformed JSON (400) like any
    other, instead of a RecursionError (500).

    A body whose `Content-Type` names a charset other than UTF-8 is refused for its
    form (415): the idempotency key's fingerprint reads the body as UTF-8, so a
    body read as anything else would be another request under the same
    fingerprint (the same bytes in Latin-1 mean other text), or the same request
    under another one (key order would matter again)."""

    def parse(
        self,
        stream: Any,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        # DRF's own choice of charset, which refuses codecs that are not text.
        encoding = parsers.get_encoding(parser_context or {})  # type: ignore[attr-defined]
        if codecs.lookup(encoding).name not in JSON_CHARSETS:
            raise UnsupportedMediaType(
                media_type or "",
                f"JSON is UTF-8; the charset {encoding!r} is not taken.",
            )
        try:
            text = stream.read().decode(encoding)
            parse_constant = json.strict_constant if self.strict else None
            return jsonparse.loads(text, parse_constant=parse_constant)
        except ValueError as exc:  # UnicodeDecodeError and TooDeep are ValueErrors
            raise ParseError(f"JSON parse error - {exc}") from None
