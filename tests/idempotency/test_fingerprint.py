"""Canonical JSON: key order and whitespace never change a fingerprint; any value
change does."""

import hashlib
import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from idempotency import jsonparse
from idempotency.fingerprint import (
    _reads_as_empty,
    canonical_body,
    changed_fields,
    fingerprint,
    key_of,
    legacy_fingerprints,
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=8), inner, max_size=4),
    ),
    max_leaves=20,
)
bodies = st.dictionaries(
    st.text(min_size=1, max_size=8), documents, min_size=1, max_size=6
)


def shuffled(value, rng: random.Random):
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


def fp(raw: str) -> str:
    return fingerprint("POST", "/api/v1/orders", raw.encode())[0]


@given(body=bodies, seed=st.integers(), indent=st.sampled_from([None, 0, 2, "\t"]))
def test_key_order_and_whitespace_do_not_matter(body, seed, indent):
    other = json.dumps(
        shuffled(body, random.Random(seed)), indent=indent, ensure_ascii=seed % 2 == 0
    )
    assert fp(json.dumps(body)) == fp(other)


@given(body=bodies, data=st.data())
def test_any_value_change_changes_the_fingerprint(body, data):
    field = data.draw(st.sampled_from(sorted(body)))
    new_value = data.draw(
        documents.filter(
            lambda v: (
                canonical_body(json.dumps(v).encode())[0]
                != canonical_body(json.dumps(body[field]).encode())[0]
            )
        )
    )
    changed = {**body, field: new_value}
    assert fp(json.dumps(body)) != fp(json.dumps(changed))
    first = fingerprint("POST", "/x", json.dumps(body).encode())[1]
    now = fingerprint("POST", "/x", json.dumps(changed).encode())[1]
    (named,) = changed_fields(first, now)
    # A name the database cannot store (NUL, a lone surrogate) is named JSON-escaped.
    assert named == field or json.loads(named) == field


def test_numbers_are_kept_as_written():
    assert fp('{"amount": 1}') != fp('{"amount": 1.0}')
    assert fp('{"amount": 100}') != fp('{"amount": 1e2}')
    assert fp('{"amount": 12345678901234567890123}') != fp(
        '{"amount": 12345678901234567890124}'
    )


def test_method_and_path_are_part_of_it():
    body = b'{"a": 1}'
    assert fingerprint("POST", "/a", body)[0] != fingerprint("POST", "/b", body)[0]
    assert fingerprint("POST", "/a", body)[0] != fingerprint("PUT", "/a", body)[0]


def test_non_json_bodies_are_fingerprinted_by_their_bytes():
    assert fp("not json") == fp("not json")
    assert fp("not json") != fp("not json!")
    assert fp("") == fp("  ")


def test_no_body_is_an_empty_object():
    """The parser reads no body as `{}`; so does the fingerprint."""
    assert fp("") == fp("{}") == fp(" {\n\t} ") == fp("  ")
    assert fp("") not in {fp("null"), fp("[]"), fp('""'), fp('{"a": 1}')}


def test_the_fingerprint_of_no_body_before_it_read_as_an_object_is_an_alias():
    legacy = hashlib.sha256(b"POST\n/api/v1/orders\n").hexdigest()
    for body in (b"", b"  ", b"{}", b" { } "):
        assert legacy_fingerprints("POST", "/api/v1/orders", body) == (legacy,)
    for body in (b"null", b"[]", b'{"a": 1}', b"{", b"not json"):
        assert legacy_fingerprints("POST", "/api/v1/orders", body) == ()


@given(raw=st.binary(max_size=6) | st.text(alphabet=" \t\n\r\x0b{}[]a1", max_size=6))
def test_an_alias_only_for_a_body_that_reads_as_an_empty_object(raw):
    raw = raw.encode() if isinstance(raw, str) else raw
    if legacy_fingerprints("POST", "/x", raw):
        assert canonical_body(raw)[0] == "{}"


@given(raw=st.binary(max_size=6) | st.text(alphabet=" \t\n\r\x0b{}[]a1", max_size=6))
def test_a_body_told_empty_without_parsing_is_one_the_parser_reads_so(raw):
    raw = raw.encode() if isinstance(raw, str) else raw
    if _reads_as_empty(raw) and raw.strip():  # (no body at all is no JSON)
        assert jsonparse.loads(raw) == {}


@pytest.mark.parametrize(
    ("header", "key"),
    [
        (None, None),
        ("k-1", "k-1"),
        ("k-1,k-1", "k-1"),  # the field twice, as gunicorn joins it
        ("k-1, k-1", "k-1"),  # as a proxy that joins with ", " does
        ("k-1,k-1,k-1", "k-1"),
        ("a,b", "a,b"),  # two keys, or one with a comma: as it came
        ("k-1,K-1", "k-1,K-1"),
        (",", ","),
        ("k-1,", "k-1,"),
    ],
)
def test_a_key_repeated_in_the_header_is_that_key(header, key):
    assert key_of(header) == key
