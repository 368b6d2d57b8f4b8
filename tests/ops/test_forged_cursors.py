"""A cursor is opaque, but anyone can base64 one: a forged position (NUL, a word
where an id goes) is an invalid cursor (404 problem+json), never a 500."""

import base64
from urllib.parse import quote

import pytest

from orders.services import product_get_or_create
from tests.helpers import assert_problem, customer, place_order

pytestmark = pytest.mark.django_db


def forged(position: str) -> str:
    return quote(base64.b64encode(f"p={position}".encode()).decode())


@pytest.mark.parametrize(
    "path", ["/api/v1/orders", "/api/v1/products", "/api/v1/accounts/me/entries"]
)
@pytest.mark.parametrize(
    "position", ["\x00", "abc", "1e5", "2026-13-45", "", "9" * 5000]
)
def test_forged_cursor_position_is_invalid_cursor(path, position):
    user, client, _ = customer("alice", balance=1000)
    place_order(user, amount=100)
    product_get_or_create(sku="TEA", name="Tea", price=100, currency="CNY")
    response = client.get(f"{path}?cursor={forged(position)}")
    if path == "/api/v1/products" and "\x00" not in position:
        assert response.status_code == 200  # any text is a place among SKUs
        return
    assert_problem(response, 404, "not_found")
