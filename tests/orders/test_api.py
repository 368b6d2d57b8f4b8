import hashlib

import pytest

from idempotency.models import IdempotencyRecord
from idempotency.redis import get_redis
from orders.models import Order, PreOrder
from orders.services import product_get_or_create
from tests.conftest import run_in_threads
from tests.helpers import assert_problem, customer, new_key, place_order

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice():
    return customer("alice", balance=100_000)


def preorder(client) -> str:
    response = client.post("/api/v1/preorders", format="json")
    assert response.status_code == 201, response.content
    return response.json()["merchant_order_no"]


def create(client, body: dict, key: str | None = None):
    headers = {"Idempotency-Key": key or new_key()}
    return client.post("/api/v1/orders", body, format="json", headers=headers)


def test_preorder_issues_a_number_to_the_caller(alice):
    user, client, _ = alice
    response = client.post("/api/v1/preorders", format="json")
    assert response.status_code == 201
    body = response.json()
    assert set(body) == {"merchant_order_no", "expires_at"}
    assert body["merchant_order_no"].isdigit()
    assert body["expires_at"].endswith("Z")
    assert (
        PreOrder.objects.get(merchant_order_no=body["merchant_order_no"]).owner == user
    )


def test_preorder_with_a_key_returns_the_same_number_on_retry(alice):
    _, client, _ = alice
    key = new_key()
    first = client.post("/api/v1/preorders", headers={"Idempotency-Key": key})
    again = client.post("/api/v1/preorders", headers={"Idempotency-Key": key})
    assert again.content == first.content and again["Idempotent-Replayed"] == "true"
    other = client.post("/api/v1/preorders")  # no key: a fresh number each time
    assert other.json()["merchant_order_no"] != first.json()["merchant_order_no"]
    assert PreOrder.objects.count() == 2


def test_preorder_needs_a_token():
    from rest_framework.test import APIClient

    assert_problem(APIClient().post("/api/v1/preorders"), 401, "not_authenticated")


def test_create_order(alice):
    _, client, _ = alice
    no = preorder(client)
    response = create(
        client,
        {
            "merchant_order_no": no,
            "amount": 1999,
            "currency": "CNY",
            "description": "Tea",
        },
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["merchant_order_no"] == no
    assert body["amount"] == 1999 and body["currency"] == "CNY"
    assert body["status"] == "pending_payment" and body["description"] == "Tea"
    assert response["Location"].endswith(f"/api/v1/orders/{no}")
    # The order's own page also lists its payments.
    assert client.get(response["Location"]).json() == {**body, "payments": []}


def test_currency_defaults_to_cny(alice):
    _, client, _ = alice
    response = create(client, {"merchant_order_no": preorder(client), "amount": 5})
    assert response.status_code == 201
    assert response.json()["currency"] == "CNY"


def test_retry_with_the_same_key_replays_without_a_second_order(alice):
    _, client, _ = alice
    body = {"merchant_order_no": preorder(client), "amount": 300}
    key = new_key()
    first = create(client, body, key)
    again = create(client, {"amount": 300, **body}, key)  # key order does not matter
    assert first.status_code == again.status_code == 201
    assert again.content == first.content
    assert again["Location"] == first["Location"]
    assert again["Idempotent-Replayed"] == "true"
    assert Order.objects.count() == 1


def test_same_key_different_body_is_refused(alice):
    _, client, _ = alice
    no = preorder(client)
    key = new_key()
    assert (
        create(client, {"merchant_order_no": no, "amount": 300}, key).status_code == 201
    )
    response = create(client, {"merchant_order_no": no, "amount": 301}, key)
    assert_problem(response, 422, "idempotency_key_reused")
    assert Order.objects.get().amount == 300


def test_create_needs_an_idempotency_key(alice):
    _, client, _ = alice
    body = {"merchant_order_no": preorder(client), "amount": 300}
    response = client.post("/api/v1/orders", body, format="json")
    assert_problem(response, 400, "idempotency_key_missing")
    assert not Order.objects.exists()


def test_same_number_under_another_key_is_a_duplicate(alice):
    _, client, _ = alice
    no = preorder(client)
    assert create(client, {"merchant_order_no": no, "amount": 300}).status_code == 201
    body = assert_problem(
        create(client, {"merchant_order_no": no, "amount": 300}), 409, "duplicate_order"
    )
    assert f"/api/v1/orders/{no}" in body["detail"]
    assert Order.objects.count() == 1


def test_number_not_issued_to_the_caller_is_unknown(alice):
    _, client, _ = alice
    _, bob_client, _ = customer("bob")
    bobs = preorder(bob_client)
    for no in (bobs, "1234567890"):
        response = create(client, {"merchant_order_no": no, "amount": 300})
        assert_problem(response, 422, "merchant_order_no_unknown")
    assert not Order.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"amount": 100}, "merchant_order_no"),
        ({"merchant_order_no": 123, "amount": 100}, "merchant_order_no"),
        ({"merchant_order_no": "9" * 33, "amount": 100}, "merchant_order_no"),
        ({"merchant_order_no": "1\x00", "amount": 100}, "merchant_order_no"),
        ({"merchant_order_no": "N"}, "amount"),
        ({"merchant_order_no": "N", "amount": "100"}, "amount"),
        ({"merchant_order_no": "N", "amount": 100.0}, "amount"),
        ({"merchant_order_no": "N", "amount": 1.5}, "amount"),
        ({"merchant_order_no": "N", "amount": True}, "amount"),
        ({"merchant_order_no": "N", "amount": None}, "amount"),
        ({"merchant_order_no": "N", "amount": 0}, "amount"),
        ({"merchant_order_no": "N", "amount": -5}, "amount"),
        ({"merchant_order_no": "N", "amount": 10**20}, "amount"),
        ({"merchant_order_no": "N", "amount": 1, "currency": "cny"}, "currency"),
        ({"merchant_order_no": "N", "amount": 1, "currency": "CNYY"}, "currency"),
        ({"merchant_order_no": "N", "amount": 1, "currency": 156}, "currency"),
        ({"merchant_order_no": "N", "amount": 1, "currency": "CN\n"}, "currency"),
        (
            {"merchant_order_no": "N", "amount": 1, "description": "x" * 256},
            "description",
        ),
        ({"merchant_order_no": "N", "amount": 1, "description": ["x"]}, "description"),
        ({"merchant_order_no": "N", "amount": 1, "status": "paid"}, "status"),
    ],
)
def test_bad_input_is_a_validation_problem(alice, body, field):
    _, client, _ = alice
    no = preorder(client)
    if body.get("merchant_order_no") == "N":
        body = {**body, "merchant_order_no": no}
    response = create(client, body)
    problem = assert_problem(response, 400, "validation_error")
    assert field in problem["errors"], problem
    assert not Order.objects.exists()


def test_a_nul_in_text_is_named_as_such(alice):
    _, client, _ = alice
    body = {"merchant_order_no": preorder(client), "amount": 1, "description": "a\x00"}
    problem = assert_problem(create(client, body), 400, "validation_error")
    assert problem["errors"]["description"] == [
        "Text may not contain NUL characters (\\u0000)."
    ]
    assert not Order.objects.exists()


@pytest.mark.parametrize(
    ("field", "spaced"),
    [
        ("currency", " CNY"),
        ("currency", "CNY "),
        ("currency", "CNY\u3000"),  # an ideographic space: whitespace too
        ("merchant_order_no", " {no}"),
        ("merchant_order_no", "{no}\n"),
        ("items", " TEA"),
        ("items", "TEA\t"),
    ],
)
def test_an_identifier_with_whitespace_around_it_is_refused_not_trimmed(
    alice, field, spaced
):
    """DRF's CharField trimmed it: `" CNY"` placed an order in CNY, `" <no>"` the
    order numbered `<no>`, `" TEA"` took tea's stock, each another request than
    the one sent. Refused as a field that fails the schema: its key stays free."""
    product_get_or_create(sku="TEA", name="Tea", price=100, currency="CNY")
    _, client, _ = alice
    no = preorder(client)
    body: dict = {"merchant_order_no": no, "amount": 100, "currency": "CNY"}
    if field == "items":
        body = {"merchant_order_no": no, "items": [{"sku": spaced, "quantity": 1}]}
    else:
        body[field] = spaced.format(no=no)
    key = new_key()
    problem = assert_problem(create(client, body, key), 400, "validation_error")
    message = "Remove the whitespace around the value: it is taken as sent."
    if field == "items":
        assert problem["errors"] == {"items": {"0": {"sku": [message]}}}
    else:
        assert problem["errors"] == {field: [message]}
    assert not Order.objects.exists()
    corrected = {"merchant_order_no": no, "amount": 100, "currency": "CNY"}
    assert create(client, corrected, key).status_code == 201


def test_free_text_is_still_trimmed(alice):
    _, client, _ = alice
    body = {"merchant_order_no": preorder(client), "amount": 1, "description": " Tea "}
    response = create(client, body)
    assert response.status_code == 201, response.content
    assert response.json()["description"] == "Tea"


@pytest.mark.parametrize(
    "raw", [b"[1, 2]", b'"text"', b"null", b"{", b"\xff\xfe", b"1e999999"]
)
def test_malformed_bodies_are_client_errors(alice, raw):
    _, client, _ = alice
    response = client.generic(
        "POST",
        "/api/v1/orders",
        raw,
        content_type="application/json",
        headers={"Idempotency-Key": new_key()},
    )
    assert 400 <= response.status_code < 500, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert not Order.objects.exists()


def test_orders_are_visible_to_their_owner_only(alice):
    user, client, _ = alice
    order = place_order(user)
    assert client.get(f"/api/v1/orders/{order.merchant_order_no}").status_code == 200
    _, bob_client, _ = customer("bob")
    assert_problem(
        bob_client.get(f"/api/v1/orders/{order.merchant_order_no}"), 404, "not_found"
    )
    assert_problem(client.get("/api/v1/orders/nope"), 404, "not_found")


def test_cancel_an_order_and_replay_it(alice):
    user, client, _ = alice
    order = place_order(user)
    url = f"/api/v1/orders/{order.merchant_order_no}/cancel"
    key = new_key()
    first = client.post(url, format="json", headers={"Idempotency-Key": key})
    assert first.status_code == 200, first.content
    assert first.json()["status"] == "cancelled"
    again = client.post(url, format="json", headers={"Idempotency-Key": key})
    assert again.content == first.content and again["Idempotent-Replayed"] == "true"
    other = client.post(url, format="json", headers={"Idempotency-Key": new_key()})
    body = assert_problem(other, 409, "order_not_cancellable")
    assert body["detail"] == (
        f"Order {order.merchant_order_no} is cancelled; it cannot be cancelled."
    )


def cancel(client, order, body: bytes, key: str):
    return client.post(
        f"/api/v1/orders/{order.merchant_order_no}/cancel",
        body,
        content_type="application/json",
        headers={"Idempotency-Key": key},
    )


@pytest.mark.parametrize(("first", "retry"), [(b"", b"{}"), (b"{}", b"")])
@pytest.mark.parametrize("cached", [True, False])
def test_no_body_and_an_empty_object_are_one_request(alice, first, retry, cached):
    """The endpoint reads no body as `{}`, so a retry that sends the other one is
    the same request: replayed (from Redis's cache or from the record), not refused
    as a key reused for another request."""
    user, client, _ = alice
    order, key = place_order(user), new_key()
    answer = cancel(client, order, first, key)
    assert answer.status_code == 200, answer.content
    if not cached and (redis := get_redis()) is not None:
        redis.flushdb()
    again = cancel(client, order, retry, key)
    assert again.status_code == 200, again.content
    assert again.content == answer.content and again["Idempotent-Replayed"] == "true"
    assert_problem(
        cancel(client, order, b'{"x": 1}', key), 422, "idempotency_key_reused"
    )


def test_a_key_stored_for_no_body_before_it_read_as_an_object_still_replays(alice):
    """A record written when no body was fingerprinted as no text at all (before
    this version) is still this request's, empty or `{}`."""
    user, client, _ = alice
    order, key = place_order(user), new_key()
    answer = cancel(client, order, b"", key)
    path = f"/api/v1/orders/{order.merchant_order_no}/cancel"
    legacy = hashlib.sha256(f"POST\n{path}\n".encode()).hexdigest()
    assert IdempotencyRecord.objects.filter(key=key).update(fingerprint=legacy) == 1
    if (redis := get_redis()) is not None:
        redis.flushdb()
    for body in (b"", b"{}"):
        again = cancel(client, order, body, key)
        assert again.content == answer.content, again.content
        assert again["Idempotent-Replayed"] == "true"


def test_cancel_needs_a_key_and_the_owner(alice):
    user, client, _ = alice
    order = place_order(user)
    url = f"/api/v1/orders/{order.merchant_order_no}/cancel"
    assert_problem(client.post(url), 400, "idempotency_key_missing")
    _, bob_client, _ = customer("bob")
    response = bob_client.post(url, headers={"Idempotency-Key": new_key()})
    assert_problem(response, 404, "not_found")
    order.refresh_from_db()
    assert order.status == Order.Status.PENDING_PAYMENT


@pytest.mark.django_db(transaction=True)
def test_racing_creates_under_different_keys_make_one_order(on_postgres):
    _, client, _ = customer("carol")
    no = preorder(client)

    def post(i: int):
        return create(client, {"merchant_order_no": no, "amount": 700}).status_code

    statuses = run_in_threads(6, post)
    assert sorted(statuses) == [201] + [409] * 5, statuses
    assert Order.objects.filter(merchant_order_no=no).count() == 1


@pytest.mark.django_db(transaction=True)
def test_racing_retries_of_one_key_execute_once(on_postgres):
    _, client, _ = customer("dave")
    no = preorder(client)
    key = new_key()

    def post(i: int):
        response = create(client, {"merchant_order_no": no, "amount": 700}, key)
        return response.status_code, response.headers.get("Idempotent-Replayed")

    results = run_in_threads(6, post)
    executed = [r for r in results if r == (201, None)]
    assert len(executed) == 1, results
    assert all(r[0] in (201, 409) for r in results), results
    assert Order.objects.filter(merchant_order_no=no).count() == 1
