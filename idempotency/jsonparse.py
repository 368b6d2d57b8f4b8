"""Parse JSON that came from outside, with a bound on how deeply it nests and no
name twice in an object.

Python's `json` recurses once per level of nesting, and so does anything that walks
what it returns (the canonical form of a fingerprint, a serializer): a 6 KB body of
`[[[[...` raises RecursionError, which would be a 500. Every request body the app
reads as JSON goes through `loads`, which refuses a document nested deeper than
`MAX_DEPTH` with a `ValueError`, the error any other malformed JSON raises, so each
caller already answers it as malformed JSON.

An object that names a member twice (`{"amount": 5, "amount": 6}`) is refused the
same way. JSON leaves its meaning open: Python keeps the last value, other parsers
the first, so a proxy, a log reader or an auditor in front of the app could read
another payment than the one the app makes.
"""

import json
import re
from typing import Any

# Far deeper than any body of this API (an order with items is three levels), far
# shallower than the interpreter's recursion limit.
MAX_DEPTH = 64

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


class TooDeep(ValueError):
    pass


class DuplicateName(ValueError):
    pass


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    made = dict(pairs)
    if len(made) < len(pairs):
        names = [name for name, _ in pairs]
        twice = next(name for name in names if names.count(name) > 1)
        raise DuplicateName(f"the name {twice!r} appears twice in one object")
    return made


def too_deep(text: str, limit: int = MAX_DEPTH) -> bool:
    """Does `text` open more than `limit` arrays or objects inside each other?

    Without recursion: strings are cut out first (a bracket inside one is not
    structure), then the brackets left are counted. For text that is not JSON the
    answer may be wrong either way; `json.loads` refuses such text anyway.
    """
    if text.count("[") + text.count("{") <= limit:  # the common case, in C
        return False
    depth = 0
    for bracket in _BRACKET.finditer(_STRING.sub("", text)):
        if bracket[0] in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def loads(raw: str | bytes, **kwargs: Any) -> Any:
    """`json.loads`, refusing a document nested deeper than `MAX_DEPTH` or an object
    that names a member twice."""
    if isinstance(raw, bytes | bytearray):
        # As json.loads does it; a lone surrogate escaped in the text stays valid.
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")
    else:
        text = raw
    if too_deep(text):
        raise TooDeep(f"JSON nested deeper than {MAX_DEPTH} levels")
    return json.loads(text, object_pairs_hook=_object, **kwargs)
