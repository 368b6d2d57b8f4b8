"""Idempotency keys and request fingerprints.

A fingerprint is SHA-256 over the method, the path and a canonical form of the JSON
body: object keys sorted, no insignificant whitespace, strings in one escaping, and
numbers exactly as written (`1.0` and `1` are different requests; we never round). An
empty body is `{}`, as the endpoints read it: a void, a cancel or a capture sent with
no body and retried with `{}` (or the other way round) is the same request.
"""

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from . import jsonparse

KEY_PATTERN = re.compile(r"[\x20-\x7e]{1,255}")
HEADER = "Idempotency-Key"


def key_is_valid(key: str) -> bool:
    """1 to 255 printable ASCII characters."""
    return KEY_PATTERN.fullmatch(key) is not None


def key_of(header: str | None) -> str | None:
    """The key an `Idempotency-Key` header names.

    A client library or a proxy that sends the field twice makes the server see the
    two values joined by a comma (`k,k`; some proxies join with `, `). The same key
    repeated is that one key: read literally, `k,k` would be a new key, and the
    retry that sends `k` once a second execution. Different values stay as they
    came (a comma is a printable character of a key like any other)."""
    if header is None or "," not in header:
        return header
    first, *others = (part.strip(" \t") for part in header.split(","))
    return first if first and all(other == first for other in others) else header


def request_key(headers: Mapping[str, str]) -> str | None:
    """The key a request names (`key_of` its `Idempotency-Key` header), or None."""
    return key_of(headers.get(HEADER))


# The canonical text of an empty body: the parser reads one as an object without
# members, so it is the same request as `{}`.
EMPTY = "{}"


class Number(str):
    """A JSON number kept as the text it was written as."""


def _loads(raw: bytes) -> Any:
    return jsonparse.loads(
        raw, parse_int=Number, parse_float=Number, parse_constant=Number
    )


def canonical(value: Any) -> str:
    """Serialize a parsed JSON value canonically."""
    if isinstance(value, Number):
        return str.__str__(value)
    if isinstance(value, dict):
        items = sorted(value.items())
        return "{" + ",".join(f"{canonical(k)}:{canonical(v)}" for k, v in items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(canonical(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def canonical_body(raw: bytes) -> tuple[str, dict[str, str]]:
    """Return the canonical text of a request body and, for a JSON object, the
    canonical text of each top-level field's value (by name).

    A body that is not JSON, or nests deeper than `jsonparse.MAX_DEPTH` (which
    `canonical` could not walk), is fingerprinted as its raw bytes: the view will
    refuse it anyway, and the same bytes must still get the same refusal.
    """
    if _reads_as_empty(raw):  # as the parser reads it: no members (no need to ask it)
        return EMPTY, {}
    try:
        parsed = _loads(raw)
    except (ValueError, UnicodeDecodeError):
        return "raw:" + hashlib.sha256(raw).hexdigest(), {}
    if not isinstance(parsed, dict):
        return canonical(parsed), {}
    # `canonical(parsed)`, each value serialized once for the text and its field.
    values = {name: canonical(value) for name, value in parsed.items()}
    text = ",".join(f"{canonical(name)}:{values[name]}" for name in sorted(values))
    return "{" + text + "}", values


def _utf8(text: str) -> bytes:
    # JSON may spell lone surrogates ("\ud800"); hash them rather than crash.
    return text.encode("utf-8", "surrogatepass")


def _short_hash(text: str) -> str:
    return hashlib.sha256(_utf8(text)).hexdigest()[:16]


def _storable(name: str) -> str:
    """A field name as the database can store it: PostgreSQL text and jsonb refuse
    NUL and lone surrogates, so such a name is kept JSON-escaped instead."""
    if "\x00" in name:
        return json.dumps(name)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(name)
    return name


def fingerprint(method: str, path: str, raw_body: bytes) -> tuple[str, dict[str, str]]:
    """Return the request's fingerprint and a short hash of each top-level field."""
    text, values = canonical_body(raw_body)
    digest = hashlib.sha256(_utf8(f"{method}\n{path}\n{text}")).hexdigest()
    fields = {_storable(name): _short_hash(value) for name, value in values.items()}
    return digest, fields


def legacy_fingerprints(method: str, path: str, raw_body: bytes) -> tuple[str, ...]:
    """The fingerprints this request had before an empty body was read as `{}`.

    A record stored then for an empty body holds the digest of no body text at all;
    its retries (empty, or `{}`) must still be answered from it, not refused as
    another request. Needed until every such record has expired (one
    `IDEMPOTENCY_TTL_SECONDS` after the change is deployed), then this can go.
    """
    if not _reads_as_empty(raw_body):
        return ()
    return (hashlib.sha256(_utf8(f"{method}\n{path}\n")).hexdigest(),)


JSON_SPACE = b" \t\n\r"


def _reads_as_empty(raw: bytes) -> bool:
    """Whitespace only, or `{}` with JSON whitespace around and in it: a body whose
    canonical text is `EMPTY`, told without parsing it again."""
    if not raw.strip():
        return True
    inner = raw.strip(JSON_SPACE)
    return (
        inner[:1] == b"{" and inner[-1:] == b"}" and not inner[1:-1].strip(JSON_SPACE)
    )


def changed_fields(first: dict[str, str], now: dict[str, str]) -> list[str]:
    """The top-level fields whose presence or value differs between two requests."""
    return sorted(k for k in first.keys() | now.keys() if first.get(k) != now.get(k))
