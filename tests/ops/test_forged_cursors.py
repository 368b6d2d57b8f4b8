"""A cursor is opaque, but anyone can write one: one that does not decode, or a
forged position (NUL, a word where an id goes), is bad input, a 400 problem+json
naming `cursor` like any other query parameter, never a 404 nor a 500."""

import base64
from urllib.parse import quote

import pytest

from orders.services import product_get_or_create
from tests.helpers import assert_problem, customer, place_order

pytestmark = pytest.mark.django_db

PAGED = ["/api/v1/orders", "/api/v1/products", "/api/v1/accounts/me/entries"]


def forged(position: str) -> str:
    return quote(base64.b64encode(f"p={position}".encode()).decode())


def assert_invalid_cursor(response) -> None:
    body = assert_problem(response, 400, "validation_error")
    assert list(body["errors"]) == ["cursor"], body


@pytest.fixture
def client():
    user, client, _ = customer("alice", balance=1000)
    place_order(user, amount=100)
    place_order(user, amount=200)
    product_get_or_create(sku="TEA", name="Tea", price=100, currency="CNY")
    product_get_or_create(sku="TEA2", name="Tea", price=100, currency="CNY")
    return client


@pytest.mark.parametrize("path", PAGED)
@pytest.mark.parametrize(
    "position", ["\x00", "abc", "1e5", "2026-13-45", "", "9" * 5000]
)
def test_forged_cursor_position_is_invalid_cursor(client, path, position):
    response = client.get(f"{path}?cursor={forged(position)}")
    if path == "/api/v1/products" and "\x00" not in position:
        assert response.status_code == 200  # any text is a place among SKUs
        return
    assert_invalid_cursor(response)


@pytest.mark.parametrize("path", PAGED)
@pytest.mark.parametrize("cursor", ["garbage", "%C3%A9", "cD0", "%2Fw%3D%3D"])
def test_a_cursor_that_does_not_decode_is_bad_input(client, path, cursor):
    # DRF answers 404 "Invalid cursor": as if the list were not there.
    assert_invalid_cursor(client.get(f"{path}?cursor={cursor}"))


@pytest.mark.parametrize("path", PAGED)
def test_a_cursor_the_api_made_still_pages(client, path):
    first = client.get(f"{path}?page_size=1").json()
    if path != "/api/v1/accounts/me/entries":  # (one deposit only)
        assert client.get(first["next"]).status_code == 200
