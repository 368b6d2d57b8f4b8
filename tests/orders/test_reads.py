"""The read side: the caller's orders (newest first, paginated, by status), an
order's payments, a payment by id. Owner only: anyone else gets 404."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from orders.services import (
    order_cancel,
    order_create,
    preorder_create,
    product_get_or_create,
    stock_top_up,
)
from payments.services import payment_pay_with_balance
from tests.helpers import assert_problem, customer, place_order

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice():
    user, client, _ = customer("alice", balance=100_000)
    return user, client


def test_orders_newest_first_paginated_and_by_status(alice):
    user, client = alice
    placed = [place_order(user, amount=100 + n) for n in range(5)]
    payment_pay_with_balance(order_id=placed[1].pk)
    payment_pay_with_balance(order_id=placed[3].pk)
    order_cancel(order_id=placed[4].pk)
    other, _, _ = customer("bob")
    place_order(other)

    page = client.get("/api/v1/orders?page_size=2").json()
    assert set(page) == {"next", "previous", "results"}
    assert [o["amount"] for o in page["results"]] == [104, 103]
    assert page["previous"] is None
    rest = client.get(page["next"]).json()
    assert [o["amount"] for o in rest["results"]] == [102, 101]
    last = client.get(rest["next"]).json()
    assert [o["amount"] for o in last["results"]] == [100]
    assert last["next"] is None

    paid = client.get("/api/v1/orders?status=paid").json()["results"]
    assert [(o["amount"], o["status"]) for o in paid] == [(103, "paid"), (101, "paid")]
    pending = client.get("/api/v1/orders?status=pending_payment&page_size=1").json()
    assert [o["amount"] for o in pending["results"]] == [102]
    # The filter stays on the next page's link.
    assert "status=pending_payment" in pending["next"]
    assert [o["amount"] for o in client.get(pending["next"]).json()["results"]] == [100]
    cancelled = client.get("/api/v1/orders?status=cancelled").json()["results"]
    assert [o["merchant_order_no"] for o in cancelled] == [placed[4].merchant_order_no]


def test_a_page_of_orders_costs_the_same_statements_however_long(alice):
    """Each order shows its items: read for the whole page in one statement, not
    one per order (a page of 200 orders sent 200 more)."""
    user, client = alice
    tea, _ = product_get_or_create(sku="TEA", name="Tea", price=100, currency="CNY")
    stock_top_up(product_id=tea.pk, at_least=100)

    def statements() -> int:
        with CaptureQueriesContext(connection) as captured:
            response = client.get("/api/v1/orders?page_size=200")
        assert response.status_code == 200, response.content
        assert all(o["items"] for o in response.json()["results"])
        return len(captured.captured_queries)

    def place(count: int) -> None:
        for _ in range(count):
            number = preorder_create(owner=user).merchant_order_no
            order_create(owner=user, merchant_order_no=number, items=[("TEA", 1)])

    place(2)
    few = statements()
    place(20)
    assert statements() == few


@pytest.mark.parametrize("status", ["nope", "PAID", "20", "authorised"])
def test_an_unknown_status_is_a_400_problem(alice, status):
    _, client = alice
    body = assert_problem(
        client.get(f"/api/v1/orders?status={status}"), 400, "validation_error"
    )
    assert "status" in body["errors"]


def test_a_second_status_is_a_400_problem_not_ignored(alice):
    _, client = alice
    body = assert_problem(
        client.get("/api/v1/orders?status=paid&status=cancelled"),
        400,
        "validation_error",
    )
    assert body["errors"]["status"] == ["Give one status."]


def test_nobody_else_sees_my_orders(alice):
    user, _ = alice
    place_order(user)
    _, bob, _ = customer("bob")
    assert bob.get("/api/v1/orders").json()["results"] == []


def test_an_order_shows_its_payments_and_a_payment_is_read_by_id(alice):
    user, client = alice
    order = place_order(user, amount=700)
    payment = payment_pay_with_balance(order_id=order.pk)
    body = client.get(f"/api/v1/orders/{order.merchant_order_no}").json()
    assert body["payments"] == [
        {
            "id": payment.pk,
            "method": "balance",
            "amount": 700,
            "status": "succeeded",
            "created_at": body["payments"][0]["created_at"],
        }
    ]
    read = client.get(f"/api/v1/payments/{payment.pk}").json()
    assert (read["id"], read["order"], read["amount"], read["status"]) == (
        payment.pk,
        order.merchant_order_no,
        700,
        "succeeded",
    )
    _, bob, _ = customer("bob")
    assert_problem(bob.get(f"/api/v1/payments/{payment.pk}"), 404, "not_found")
    assert_problem(
        bob.get(f"/api/v1/orders/{order.merchant_order_no}"), 404, "not_found"
    )
    assert_problem(client.get(f"/api/v1/payments/{payment.pk + 999}"), 404,
                   "not_found")  # fmt: skip


LISTS = ["/api/v1/orders", "/api/v1/products", "/api/v1/accounts/me/entries"]


@pytest.mark.parametrize("path", LISTS)
@pytest.mark.parametrize(
    "query",
    ["cursor=", "page_size=", "page_size=ten", "page_size=0", "page_size=-1"],
)
def test_a_blank_or_bad_page_parameter_is_a_400_naming_it(alice, path, query):
    """Not read as left out: `?page_size=` or `?page_size=ten` answered the default
    page, `?cursor=` the first one, as if nothing had been asked."""
    _, client = alice
    name = query.partition("=")[0]
    body = assert_problem(client.get(f"{path}?{query}"), 400, "validation_error")
    assert list(body["errors"]) == [name]


@pytest.mark.parametrize("path", LISTS)
def test_a_page_parameter_given_twice_is_a_400_naming_it(alice, path):
    _, client = alice
    body = assert_problem(
        client.get(f"{path}?page_size=1&page_size=2"), 400, "validation_error"
    )
    assert body["errors"] == {"page_size": ["Give one page_size."]}


def test_a_blank_status_is_a_400_not_the_whole_list(alice):
    """`?status=` listed every order, as if no filter had been asked for."""
    user, client = alice
    place_order(user)
    body = assert_problem(client.get("/api/v1/orders?status="), 400, "validation_error")
    assert list(body["errors"]) == ["status"]
    assert_problem(
        client.get("/api/v1/orders?status=&status="), 400, "validation_error"
    )
