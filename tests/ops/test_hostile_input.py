"""Hostile input, on every endpoint that takes it: never a 5xx, always problem+json,
nothing written.

The classes of input here are also generated at random, with a live gunicorn, by the
fuzzing in `test_schema_fuzzing.py` and in-process by the property below: JSON nested
thousands deep, lone surrogates in values and in field names, NUL in every path
segment and field, integers past 64 bits, currencies the ledger does not hold.
"""

import json
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from idempotency.jsonparse import MAX_DEPTH
from idempotency.models import IdempotencyRecord
from ledger.models import JournalEntry, Transfer
from ledger.openapi import problem_codes
from orders.models import Order
from payments.models import Payment, ProviderEvent, Refund
from payments.services import payment_pay_with_balance
from tests.helpers import (
    assert_problem,
    customer,
    event_body,
    new_key,
    pending_provider_payment,
    place_order,
    post_callback,
)

pytestmark = pytest.mark.django_db

DEEP_ARRAY = b"[" * 3000 + b"]" * 3000  # 6 KB
DEEP_OBJECT = b'{"a":' * 3000 + b"1" + b"}" * 3000
TOO_DEEP = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)


class World:
    """A customer with money, an order to pay, a paid one to refund, and their
    counts, so a test can say "nothing was written"."""

    def __init__(self) -> None:
        self.user, self.client, self.wallet = customer("alice", balance=100_000)
        self.order = place_order(self.user, amount=1000)
        paid = place_order(self.user, amount=500)
        self.payment = payment_pay_with_balance(order_id=paid.pk)
        self.provider_payment = pending_provider_payment(
            place_order(self.user, amount=700)
        )
        self.counts = self.count()

    def count(self) -> dict[str, int]:
        return {
            "orders": Order.objects.count(),
            "payments": Payment.objects.count(),
            "refunds": Refund.objects.count(),
            "entries": JournalEntry.objects.count(),
            "events": ProviderEvent.objects.count(),
            "paid": Order.objects.filter(status=Order.Status.PAID).count(),
            "cancelled": Order.objects.filter(status=Order.Status.CANCELLED).count(),
            "transfers": Transfer.objects.count(),
        }

    def writes(self) -> list[str]:
        """The path of every endpoint that reads a JSON body under a key."""
        no = self.order.merchant_order_no
        return [
            "/api/v1/orders",
            f"/api/v1/orders/{no}/pay",
            f"/api/v1/payments/{self.payment.pk}/refund",
            "/api/v1/transfers",
        ]

    def post(self, path: str, raw: bytes, key: str | None = None):
        return self.client.generic(
            "POST",
            path,
            raw,
            content_type="application/json",
            headers={"Idempotency-Key": key or new_key()},
        )


@pytest.fixture
def world() -> World:
    return World()


# 2. JSON nested thousands deep ---------------------------------------------------


@pytest.mark.parametrize("raw", [DEEP_ARRAY, DEEP_OBJECT, TOO_DEEP])
def test_deep_nesting_is_malformed_json_on_every_write(world, raw):
    for path in world.writes():
        response = world.post(path, raw)
        assert_problem(response, 400, "malformed_json")
        assert "deeper than" in response.json()["detail"], path
    assert world.count() == world.counts


def test_deep_nesting_is_kept_or_not_under_its_key_as_any_malformed_json(world):
    """Whatever the engine does with the key of a request refused for its form, a
    body nested too deeply gets exactly that: it is malformed JSON like `{`."""
    for path in world.writes():
        deep, broken = new_key("deep"), new_key("broken")
        assert world.post(path, DEEP_ARRAY, deep).status_code == 400
        assert world.post(path, b"{", broken).status_code == 400
        records = IdempotencyRecord.objects
        assert records.filter(key=deep).exists() == records.filter(key=broken).exists()
        again = world.post(path, DEEP_ARRAY, deep)
        assert_problem(again, 400, "malformed_json")
    assert world.count() == world.counts


def test_deep_nesting_just_inside_the_bound_is_parsed(world):
    nested = b'{"merchant_order_no": "1", "amount": 5, "x": ' + TOO_DEEP[2:-2] + b"}"
    response = world.post("/api/v1/orders", nested)
    problem = assert_problem(response, 400, "validation_error")
    assert problem["errors"] == {"x": ["Unknown field."]}


# A name twice in one object ------------------------------------------------------


DUPLICATE_AMOUNT = b'{"to": "bob", "amount": 5, "amount": 6}'


def test_a_name_twice_in_an_object_is_malformed_json_on_every_write(world):
    """`{"amount": 5, "amount": 6}`: Python reads 6, other parsers 5; a proxy or an
    auditor in front of the app could read another payment than the one made."""
    customer("bob")
    nested = b'{"to": "bob", "amount": 5, "x": {"a": 1, "a": 2}}'
    for path in world.writes():
        for raw in (DUPLICATE_AMOUNT, nested):
            response = world.post(path, raw)
            assert_problem(response, 400, "malformed_json")
            assert "appears twice" in response.json()["detail"], path
    assert_problem(post_callback(DUPLICATE_AMOUNT), 400, "malformed_json")
    assert world.count() == world.counts


def test_the_corrected_request_may_use_the_key_of_one_with_a_name_twice(world):
    customer("bob")
    key = new_key("twice")
    assert_problem(
        world.post("/api/v1/transfers", DUPLICATE_AMOUNT, key), 400, "malformed_json"
    )
    corrected = world.post("/api/v1/transfers", b'{"to": "bob", "amount": 6}', key)
    assert corrected.status_code == 201, corrected.content
    assert world.count()["transfers"] == world.counts["transfers"] + 1


# A megabyte of items or of unknown fields ----------------------------------------


def many(item: str, count: int) -> str:
    return "[" + ",".join([item] * count) + "]"


@pytest.mark.parametrize(
    ("path", "raw", "field", "limit"),
    [
        (
            "/api/v1/transfers",
            f'{{"transfers": {many("1", 400_000)}}}',
            "transfers",
            100,
        ),
        (
            "/api/v1/transfers",
            f'{{"transfers": {many("{}", 200_000)}}}',
            "transfers",
            100,
        ),
        (
            "/api/v1/orders",
            f'{{"merchant_order_no": "1", "items": {many("{}", 200_000)}}}',
            "items",
            50,
        ),
    ],
)
def test_a_list_too_long_is_refused_for_its_length_before_its_items(
    world, path, raw, field, limit
):
    """Its items are not looked at (each invalid one was an error of its own: 33 MB
    of errors, seconds of CPU); the answer says how many are allowed."""
    response = world.post(path, raw.encode())
    problem = assert_problem(response, 400, "validation_error")
    assert problem["errors"] == {
        field: [f"Ensure this field has no more than {limit} elements."]
    }
    assert len(response.content) < 1000
    assert world.count() == world.counts


def test_tens_of_thousands_of_unknown_fields_are_counted_and_ten_named(world):
    names = [f"k{n}" for n in range(60_000)]
    for path, wrap in (
        ("/api/v1/transfers", "{%s}"),
        ("/api/v1/transfers", '{"transfers": [{%s}]}'),
        (
            f"/api/v1/orders/{world.order.merchant_order_no}/pay",
            '{"method": "balance", %s}',
        ),
    ):
        raw = wrap % ",".join(f'"{name}": 1' for name in names)
        problem = assert_problem(
            world.post(path, raw.encode()), 400, "validation_error"
        )
        errors = problem["errors"]
        if "transfers" in errors:  # (the first item's errors)
            errors = errors["transfers"]["0"]
        assert errors["non_field_errors"] == [
            "60000 unknown fields; the first 10 are named."
        ], path
        assert sorted(set(errors) - {"non_field_errors"}) == sorted(names)[:10]
    assert world.count() == world.counts


def test_an_unknown_field_named_like_the_count_is_still_named(world):
    names = ["non_field_errors", *(f"z{n}" for n in range(11))]
    raw = json.dumps(dict.fromkeys(names, 1))
    problem = assert_problem(
        world.post("/api/v1/transfers", raw.encode()), 400, "validation_error"
    )
    assert problem["errors"]["non_field_errors"] == [
        "Unknown field.",
        "12 unknown fields; the first 10 are named.",
    ]
    assert len(problem["errors"]) == 10
    assert world.count() == world.counts


@pytest.mark.parametrize("raw", [DEEP_ARRAY, DEEP_OBJECT])
def test_deep_nesting_on_the_endpoints_without_a_body_is_never_a_5xx(world, raw):
    """Pre-order takes no body and ignores one, however deep; cancel accepts only an
    empty one and refuses any other for its form (stored under no key). Neither
    recurses on it (the fingerprint is the canonical form of the body)."""
    preorder = world.post("/api/v1/preorders", raw)
    assert preorder.status_code == 201, preorder.content
    no = world.order.merchant_order_no
    assert_problem(
        world.post(f"/api/v1/orders/{no}/cancel", raw), 400, "malformed_json"
    )


@pytest.mark.parametrize("raw", [DEEP_ARRAY, DEEP_OBJECT])
def test_deep_nesting_in_a_signed_callback_is_malformed_json(world, raw):
    assert_problem(post_callback(raw), 400, "malformed_json")
    assert world.count() == world.counts
    payment = world.provider_payment
    payment.refresh_from_db()
    assert payment.status == Payment.Status.PENDING


# 3. Lone surrogates, echoed in error messages -------------------------------------


SURROGATE = "\ud800"


def surrogate_cases(world: World) -> list[tuple[str, dict, str]]:
    no = world.order.merchant_order_no
    return [
        (f"/api/v1/orders/{no}/pay", {"method": SURROGATE}, "method"),
        (f"/api/v1/orders/{no}/pay", {"method": "balance", SURROGATE: 1}, SURROGATE),
        (
            "/api/v1/orders",
            {"merchant_order_no": no, "amount": 1, SURROGATE: 1},
            SURROGATE,
        ),
        (
            "/api/v1/orders",
            {"merchant_order_no": SURROGATE, "amount": 1},
            "merchant_order_no",
        ),
        (
            "/api/v1/orders",
            {"merchant_order_no": no, "amount": 1, "description": SURROGATE},
            "description",
        ),
        (
            "/api/v1/orders",
            {"merchant_order_no": no, "amount": 1, "currency": SURROGATE},
            "currency",
        ),
        (f"/api/v1/payments/{world.payment.pk}/refund", {SURROGATE: "x"}, SURROGATE),
        ("/api/v1/transfers", {"to": SURROGATE, "amount": 1, "currency": "CNY"}, "to"),
        (
            "/api/v1/transfers",
            {"to": "bob", "amount": 1, "currency": "CNY", "description": SURROGATE},
            "description",
        ),
        (
            "/api/v1/transfers",
            {"transfers": [{"to": SURROGATE, "amount": 1, "currency": "CNY"}]},
            "transfers",
        ),
        (
            f"/api/v1/payments/{world.payment.pk}/refund",
            {"reason": SURROGATE},
            "reason",
        ),
    ]


def test_a_lone_surrogate_is_a_validation_problem_that_echoes_it(world):
    for path, body, field in surrogate_cases(world):
        key = new_key()
        response = world.post(path, json.dumps(body).encode(), key)
        problem = assert_problem(response, 400, "validation_error")
        # The answer names the field, a lone surrogate included, as JSON spells it.
        assert field in problem["errors"], (path, problem)
        again = world.post(path, json.dumps(body).encode(), key)
        assert again.status_code == 400, again.content
    assert world.count() == world.counts


def test_a_lone_surrogate_in_a_signed_callback_is_a_validation_problem(world):
    for field in ("event_id", "merchant_order_no", "provider_txn_id", "status"):
        body = event_body(world.provider_payment, **{field: SURROGATE})
        problem = assert_problem(post_callback(body), 400, "validation_error")
        assert field in problem["errors"]
    assert world.count() == world.counts


# 4. NUL in a URL segment --------------------------------------------------------


def nul_urls(world: World) -> list[tuple[str, str]]:
    no = world.order.merchant_order_no
    return [
        ("POST", f"/api/v1/orders/{no}%00/pay"),
        ("POST", "/api/v1/orders/%00/pay"),
        ("POST", f"/api/v1/orders/{no}%00/cancel"),
        ("POST", "/api/v1/orders/%00/cancel"),
        ("GET", f"/api/v1/orders/{no}%00"),
        ("GET", "/api/v1/orders/%00"),
        ("GET", "/api/v1/idempotency-keys/a%00"),
        ("GET", "/api/v1/idempotency-keys/%00"),
        ("GET", "/api/v1/idempotency-keys/a/%00/b"),
        ("POST", "/api/v1/payments/%00/refund"),
        ("GET", "/api/v1/accounts/me/entries?cursor=%00"),
        ("GET", f"/api/v1/orders/{no}?x=%00"),
    ]


def test_a_nul_in_the_url_is_not_found(world):
    keys = IdempotencyRecord.objects.count()
    for method, url in nul_urls(world):
        response = world.client.generic(
            method,
            url,
            b'{"method": "balance"}' if method == "POST" else b"",
            content_type="application/json",
            headers={"Idempotency-Key": new_key()},
        )
        assert_problem(response, 404, "not_found")
    assert world.count() == world.counts
    assert IdempotencyRecord.objects.count() == keys


# 7. Currencies the ledger does not hold -----------------------------------------


@pytest.mark.parametrize("currency", ["ZZZ", "XXX", "JPY", "CNH", "BTC"])
def test_an_unknown_currency_is_refused_and_named(world, currency):
    no = world.client.post("/api/v1/preorders").json()["merchant_order_no"]
    body = {"merchant_order_no": no, "amount": 100, "currency": currency}
    response = world.post("/api/v1/orders", json.dumps(body).encode())
    problem = assert_problem(response, 400, "validation_error")
    assert list(problem["errors"]) == ["currency"]
    assert "CNY" in problem["errors"]["currency"][0]
    assert world.count() == world.counts


@pytest.mark.parametrize("currency", ["CNY", "USD", "EUR"])
def test_the_supported_currencies_are_taken(world, currency):
    no = world.client.post("/api/v1/preorders").json()["merchant_order_no"]
    body = {"merchant_order_no": no, "amount": 100, "currency": currency}
    response = world.post("/api/v1/orders", json.dumps(body).encode())
    assert response.status_code == 201, response.content
    assert response.json()["currency"] == currency


def test_the_order_service_refuses_an_unknown_currency_too(world):
    from orders.services import order_create, preorder_create

    preorder = preorder_create(owner=world.user)
    with pytest.raises(ValueError, match="does not hold"):
        order_create(
            owner=world.user,
            merchant_order_no=preorder.merchant_order_no,
            amount=100,
            currency="ZZZ",
        )


# All of it at random, in process --------------------------------------------------


def assert_problem_json(response) -> dict:
    """Any 4xx answer: problem+json, whose `code` the schema documents."""
    assert 400 <= response.status_code < 500, response.content[:300]
    assert response["Content-Type"] == "application/problem+json"
    body = json.loads(response.content)
    assert {"type", "title", "status", "detail", "code"} <= set(body)
    assert body["status"] == response.status_code
    assert body["code"] in problem_codes(), body
    return body


hostile_text = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["\x00", "a\x00b", SURROGATE, "\udfff", "x" + SURROGATE]),
    st.text(alphabet=st.characters(categories=["Cs", "Cc"]), max_size=4),
)
huge_integers = st.one_of(
    st.integers(min_value=2**63 - 2, max_value=2**64 + 2),
    st.integers(min_value=-(2**64) - 2, max_value=-(2**63) + 2),
    st.just(10**400),
)
hostile_values = st.recursive(
    st.one_of(st.none(), st.booleans(), huge_integers, hostile_text),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(hostile_text, inner, max_size=3)
    ),
    max_leaves=8,
)


def nest(value: bytes, depth: int) -> bytes:
    return b"[" * depth + value + b"]" * depth


@settings(
    max_examples=120,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(
    target=st.sampled_from(
        ["order", "pay", "refund", "cancel", "detail", "key", "transfer", "list"]
    ),
    fields=st.dictionaries(
        st.sampled_from(
            [
                *("merchant_order_no", "amount", "currency", "description"),
                *("method", "reason", "x", SURROGATE, "\x00"),
                *("to", "transfers"),
            ]
        ),
        hostile_values,
        max_size=4,
    ),
    segment=st.one_of(st.none(), hostile_text),
    depth=st.sampled_from([0, 0, MAX_DEPTH, MAX_DEPTH + 1, 5000]),
)
def test_no_hostile_input_gets_a_5xx_and_a_refusal_writes_nothing(
    world, target, fields, segment, depth
):
    no = world.order.merchant_order_no
    if segment is not None:  # the path segment, %-encoded as a client sends it
        no = quote(segment.encode("utf-8", "surrogatepass"), safe="") or "%00"
    raw = nest(json.dumps(fields).encode(), depth)
    client = world.client
    before = world.count()
    match target:
        case "order":
            response = world.post("/api/v1/orders", raw)
        case "pay":
            response = world.post(f"/api/v1/orders/{no}/pay", raw)
        case "refund":
            response = world.post(f"/api/v1/payments/{world.payment.pk}/refund", raw)
        case "cancel":
            response = world.post(f"/api/v1/orders/{no}/cancel", raw)
        case "detail":
            response = client.get(f"/api/v1/orders/{no}")
        case "key":
            response = client.get(f"/api/v1/idempotency-keys/{no}")
        case "transfer":
            response = world.post("/api/v1/transfers", raw)
        case "list":
            response = client.get(f"/api/v1/orders?status={no}")
    assert response.status_code < 500, response.content[:300]
    if response.status_code >= 400:  # refused: problem+json, and nothing written
        assert_problem_json(response)
        assert world.count() == before
