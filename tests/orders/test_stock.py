"""Products and stock: movements with unique references, the conditional decrement in
the order's transaction, and stock given back exactly once on cancel or expiry."""

import json
import re
from datetime import timedelta
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone
from rest_framework.test import APIClient

from ledger.invariants import ledger_report
from orders.exceptions import OutOfStock, ProductUnknown
from orders.models import Order, OrderItem, PreOrder, Product, StockMovement
from orders.services import (
    order_cancel,
    order_cancel_expired,
    order_create,
    order_give_back_stock,
    preorder_create,
    product_get_or_create,
    stock_adjust,
    stock_move,
    stock_top_up,
)
from payments.services import payment_pay_with_balance, payment_refund
from payments.tasks import cancel_expired_orders
from tests.conftest import Background, run_in_threads
from tests.helpers import (
    assert_problem,
    blocked_on_lock,
    customer,
    new_key,
    row_locked,
    wait_for,
)

pytestmark = pytest.mark.django_db


def product(sku: str = "TEA", *, price: int = 1000, stock: int = 5, currency="CNY"):
    made, _ = product_get_or_create(
        sku=sku, name=f"{sku} name", price=price, currency=currency
    )
    if stock:
        stock_top_up(product_id=made.pk, at_least=stock)
    made.refresh_from_db()
    return made


def stock_of(sku: str) -> int:
    return Product.objects.get(sku=sku).stock


def item_order(user, *lines: tuple[str, int]) -> Order:
    number = preorder_create(owner=user).merchant_order_no
    with transaction.atomic():
        return order_create(owner=user, merchant_order_no=number, items=list(lines))


def create(client, body: dict, key: str | None = None):
    headers = {"Idempotency-Key": key or new_key()}
    return client.post("/api/v1/orders", body, format="json", headers=headers)


def preorder(client) -> str:
    return client.post("/api/v1/preorders", format="json").json()["merchant_order_no"]


def nothing_written() -> None:
    assert not Order.objects.exists()
    assert not OrderItem.objects.exists()
    assert not StockMovement.objects.filter(kind=StockMovement.Kind.ORDER).exists()


@pytest.fixture
def alice():
    return customer("alice", balance=1_000_000)


# --- services ---------------------------------------------------------------------


def test_a_movement_moves_stock_once_per_reference():
    tea = product(stock=0)
    assert stock_move(product_id=tea.pk, quantity=7, reference="r1", kind="receipt")
    assert not stock_move(product_id=tea.pk, quantity=7, reference="r1", kind="receipt")
    assert stock_of("TEA") == 7
    assert StockMovement.objects.filter(product=tea).count() == 1


def test_taking_more_than_there_is_refuses_and_the_database_agrees():
    tea = product(stock=3)
    with pytest.raises(OutOfStock), transaction.atomic():
        stock_move(product_id=tea.pk, quantity=-4, reference="r2", kind="order")
    assert stock_of("TEA") == 3
    assert not StockMovement.objects.filter(reference="r2").exists()
    with pytest.raises(IntegrityError), transaction.atomic():
        Product.objects.filter(pk=tea.pk).update(stock=-1)


def test_movements_are_append_only(on_postgres):
    tea = product(stock=3)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        StockMovement.objects.filter(product=tea).update(quantity=100)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        StockMovement.objects.filter(product=tea).delete()


def test_top_up_brings_stock_to_at_least():
    tea = product(stock=5)
    assert stock_top_up(product_id=tea.pk, at_least=3) is None
    movement = stock_top_up(product_id=tea.pk, at_least=8)
    assert movement is not None and movement.quantity == 3
    assert stock_of("TEA") == 8


def test_adjust_once_per_token():
    tea = product(stock=5)
    assert stock_adjust(product_id=tea.pk, quantity=-2, reference="tok")
    assert not stock_adjust(product_id=tea.pk, quantity=-2, reference="tok")
    assert stock_of("TEA") == 3


def test_an_item_order_takes_stock_and_prices_itself(alice):
    user, _, _ = alice
    product("TEA", price=1200, stock=5)
    product("MUG", price=450, stock=2)
    order = item_order(user, ("MUG", 1), ("TEA", 2), ("MUG", 1))
    assert (order.amount, order.currency) == (2 * 1200 + 2 * 450, "CNY")
    assert [(i.sku, i.quantity) for i in order.items.all()] == [("MUG", 2), ("TEA", 2)]
    assert (stock_of("TEA"), stock_of("MUG")) == (3, 0)
    assert ledger_report()["ok"], ledger_report()["violations"]


def test_the_first_short_line_is_named_and_nothing_is_taken(alice):
    user, _, _ = alice
    # MUG has the lower id and is taken first; TEA, named first, is short
    product("MUG", stock=5)
    product("TEA", stock=1)
    with pytest.raises(OutOfStock) as refused:
        item_order(user, ("TEA", 2), ("MUG", 5))
    assert refused.value.extra == {"sku": "TEA"}
    with pytest.raises(OutOfStock) as refused:
        item_order(user, ("MUG", 6), ("TEA", 2))
    assert refused.value.extra == {"sku": "MUG"}
    assert (stock_of("TEA"), stock_of("MUG")) == (1, 5)
    nothing_written()


def test_the_short_line_is_named_in_request_order_not_merged_order(alice):
    user, _, _ = alice
    product("MUG", stock=5)
    product("AUD-C", stock=2)
    # MUG's lines add up to 6 > 5, but AUD-C (line 1) is short first
    with pytest.raises(OutOfStock) as refused:
        item_order(user, ("MUG", 1), ("AUD-C", 3), ("MUG", 5))
    assert refused.value.extra == {"sku": "AUD-C"}
    # MUG runs out at line 1 (3 + 3 > 5), before AUD-C's line 2 (3 > 2)
    with pytest.raises(OutOfStock) as refused:
        item_order(user, ("MUG", 3), ("MUG", 3), ("AUD-C", 3))
    assert refused.value.extra == {"sku": "MUG"}
    # AUD-C runs out only at its second line (1 + 2 > 2), after MUG's line 1 (6 > 5)
    with pytest.raises(OutOfStock) as refused:
        item_order(user, ("AUD-C", 1), ("MUG", 6), ("AUD-C", 2))
    assert refused.value.extra == {"sku": "MUG"}
    assert (stock_of("MUG"), stock_of("AUD-C")) == (5, 2)
    nothing_written()


def test_a_line_short_when_taken_is_named_though_restocked_since(alice, monkeypatch):
    """Stock comes back (a cancel, a top-up) between the take that found a line
    short and the read that names it: that line is named, never a 500."""
    from orders import services

    user, _, _ = alice
    product("MUG", stock=5)
    product("TEA", stock=5)
    take = services._stock_apply

    def restocked_after_a_short_take(product_id, quantity, *args):
        if Product.objects.get(pk=product_id).sku == "TEA":
            return None  # short as it was taken; restocked by the time it is read
        return take(product_id, quantity, *args)

    monkeypatch.setattr(services, "_stock_apply", restocked_after_a_short_take)
    with pytest.raises(OutOfStock) as refused:
        item_order(user, ("MUG", 1), ("TEA", 2))
    assert refused.value.extra == {"sku": "TEA"}


def test_unknown_products_are_named(alice):
    user, _, _ = alice
    product("TEA")
    with pytest.raises(ProductUnknown) as refused:
        item_order(user, ("TEA", 1), ("NOPE", 1))
    assert refused.value.extra == {"sku": "NOPE"}
    nothing_written()


def test_cancel_gives_stock_back_once(alice):
    user, _, _ = alice
    product("TEA", stock=5)
    order = item_order(user, ("TEA", 3))
    order_cancel(order_id=order.pk)
    assert stock_of("TEA") == 5
    assert order_give_back_stock(order_id=order.pk) == 0  # a duplicate: nothing
    assert stock_of("TEA") == 5
    assert ledger_report()["ok"], ledger_report()["violations"]


def test_paid_and_refunded_orders_keep_their_stock_taken(alice):
    user, _, _ = alice
    product("TEA", stock=5)
    order = item_order(user, ("TEA", 2))
    payment = payment_pay_with_balance(order_id=order.pk)
    assert stock_of("TEA") == 3
    payment_refund(payment_id=payment.pk)
    assert stock_of("TEA") == 3
    order_cancel_expired(older_than_seconds=0)
    assert stock_of("TEA") == 3


def test_expiry_gives_stock_back_once_even_when_run_twice(alice, settings):
    user, _, _ = alice
    product("TEA", stock=5)
    old, fresh = item_order(user, ("TEA", 2)), item_order(user, ("TEA", 1))
    Order.objects.filter(pk=old.pk).update(
        created_at=timezone.now() - timedelta(hours=2)
    )
    settings.ORDER_UNPAID_EXPIRY_SECONDS = 3600
    assert cancel_expired_orders() == 1
    assert cancel_expired_orders() == 0
    assert stock_of("TEA") == 4
    assert Order.objects.get(pk=fresh.pk).status == Order.Status.PENDING_PAYMENT
    assert StockMovement.objects.filter(kind="return").count() == 1
    assert ledger_report()["ok"], ledger_report()["violations"]


def test_check_ledger_names_stock_corrupted_in_sql(alice):
    tea = product("TEA", stock=5)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE orders_product SET stock = 9 WHERE id = %s", [tea.pk])
    with pytest.raises(CommandError) as failed:
        call_command("check_ledger", stdout=StringIO(), stderr=StringIO())
    assert failed.value.returncode == 1
    violations = ledger_report()["violations"]
    assert any("'TEA' stock 9 != sum of its stock movements 5" in v for v in violations)


def test_check_ledger_names_stock_that_does_not_follow_its_order(alice):
    """A cancelled order whose stock never came back (cancelled by hand in SQL),
    and a paid one whose stock came back: each line named, as the stock itself
    still equals its movements."""
    user, _, _ = alice
    product("TEA", stock=5)
    product("MUG", stock=5)
    kept = item_order(user, ("TEA", 2), ("MUG", 1))
    paid = item_order(user, ("TEA", 1))
    payment_pay_with_balance(order_id=paid.pk)
    assert ledger_report()["ok"], ledger_report()["violations"]
    Order.objects.filter(pk=kept.pk).update(status=Order.Status.CANCELLED)
    stock_move(
        product_id=Product.objects.get(sku="TEA").pk,
        quantity=1,
        reference=f"order:{paid.pk}:return:{Product.objects.get(sku='TEA').pk}",
        kind=StockMovement.Kind.RETURN,
    )
    report = ledger_report()
    assert "stock_follows_orders" in report["checks"]
    assert [v for v in report["violations"] if "order " in v] == [
        f"order {kept.merchant_order_no} is cancelled but its 1 MUG never came back",
        f"order {kept.merchant_order_no} is cancelled but its 2 TEA never came back",
        f"order {paid.merchant_order_no} is paid but its 1 TEA came back",
    ]


def test_check_ledger_names_negative_stock(on_postgres, alice):
    tea = product("TEA", stock=0)
    with connection.cursor() as cursor:
        # Someone dropped the guard (DDL rolls back with the test's transaction).
        cursor.execute(
            "ALTER TABLE orders_product DROP CONSTRAINT product_stock_not_negative"
        )
        cursor.execute("UPDATE orders_product SET stock = -2 WHERE id = %s", [tea.pk])
    violations = ledger_report()["violations"]
    assert "product 'TEA' stock is below zero: -2" in violations


# --- create_product ----------------------------------------------------------------


def run_create_product(*args: str) -> dict:
    out = StringIO()
    call_command("create_product", *args, stdout=out)
    return json.loads(out.getvalue())


def test_create_product_is_idempotent_and_tops_up():
    first = run_create_product("TEA-1", "--name", "Tea", "--price", "1280")
    assert first == {
        "sku": "TEA-1",
        "name": "Tea",
        "price": 1280,
        "currency": "CNY",
        "stock": 0,
    }
    again = run_create_product(
        "TEA-1", "--name", "Other", "--price", "1", "--stock", "7"
    )
    assert again == {**first, "stock": 7}
    assert (
        run_create_product("TEA-1", "--name", "Tea", "--price", "1280", "--stock", "3")[
            "stock"
        ]
        == 7
    )
    assert Product.objects.count() == 1
    assert StockMovement.objects.get().quantity == 7
    usd = run_create_product(
        "MUG", "--name", "Mug", "--price", "900", "--currency", "USD"
    )
    assert usd["currency"] == "USD"


@pytest.mark.parametrize(
    "args",
    [
        ["X", "--name", "x", "--price", "0"],
        ["X", "--name", "x", "--price", "5", "--stock", "-1"],
        ["X", "--name", "x", "--price", "5", "--stock", str(10**9 + 1)],
        ["X", "--name", "x", "--price", "5", "--stock", "99999999999999999999"],
        ["X", "--name", "x", "--price", "5", "--currency", "ZZZ"],
        ["X" * 65, "--name", "x", "--price", "5"],
        # One the API's orders could never name (`" TEA"` is a 400 there, taken
        # as sent, never trimmed into `TEA`).
        [" TEA", "--name", "x", "--price", "5"],
        ["TEA\t", "--name", "x", "--price", "5"],
        [" ", "--name", "x", "--price", "5"],
        ["X", "--name", "n" * 256, "--price", "5"],  # PostgreSQL refused it: a 500
        ["X", "--name", "", "--price", "5"],
        ["X", "--name", "   ", "--price", "5"],
        ["X", "--name", "a\x00b", "--price", "5"],
    ],
)
def test_create_product_refuses_bad_input(args):
    with pytest.raises(CommandError):
        call_command("create_product", *args, stdout=StringIO())
    assert not Product.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_create_product_run_at_once_makes_one_product_stocked_once(on_postgres):
    """Two deploys (or an operator and a deploy) seed the same product at the same
    instant: one product, its stock topped up to N once, not N for each run."""
    args = ("TEA-1", "--name", "Tea", "--price", "1280", "--stock", "10")
    results = run_in_threads(6, lambda i: run_create_product(*args))
    assert all(isinstance(r, dict) for r in results), results
    assert Product.objects.get().stock == 10
    assert StockMovement.objects.get().quantity == 10
    assert {r["stock"] for r in results} == {10}


# --- the API -----------------------------------------------------------------------


def test_products_are_listed_paginated(alice):
    _, client, _ = alice
    for n in range(3):
        product(f"P{n}", price=100 + n, stock=n)
    page = client.get("/api/v1/products?page_size=2").json()
    assert page["results"] == [
        {"sku": "P0", "name": "P0 name", "price": 100, "currency": "CNY", "stock": 0},
        {"sku": "P1", "name": "P1 name", "price": 101, "currency": "CNY", "stock": 1},
    ]
    rest = client.get(page["next"]).json()
    assert [p["sku"] for p in rest["results"]] == ["P2"] and rest["next"] is None
    assert_problem(APIClient().get("/api/v1/products"), 401, "not_authenticated")


def test_order_with_items_over_the_api_and_its_retry(alice):
    _, client, _ = alice
    product("TEA", price=1200, stock=5)
    body = {
        "merchant_order_no": preorder(client),
        "items": [{"sku": "TEA", "quantity": 2}],
    }
    key = new_key()
    first = create(client, body, key)
    assert first.status_code == 201, first.content
    order = first.json()
    assert (order["amount"], order["currency"]) == (2400, "CNY")
    assert order["items"] == [
        {"sku": "TEA", "name": "TEA name", "quantity": 2, "price": 1200, "amount": 2400}
    ]
    again = create(client, body, key)
    assert again.content == first.content and again["Idempotent-Replayed"] == "true"
    assert stock_of("TEA") == 3
    detail = client.get(f"/api/v1/orders/{body['merchant_order_no']}").json()
    assert detail["items"] == order["items"]
    # an amount order shows no items
    plain = {"merchant_order_no": preorder(client), "amount": 100}
    assert create(client, plain).json()["items"] == []


def test_out_of_stock_over_the_api_is_stored_and_takes_nothing(alice):
    _, client, _ = alice
    product("TEA", stock=1)
    product("MUG", stock=9)
    body = {
        "merchant_order_no": preorder(client),
        "items": [{"sku": "MUG", "quantity": 1}, {"sku": "TEA", "quantity": 2}],
    }
    key = new_key()
    problem = assert_problem(create(client, body, key), 409, "out_of_stock")
    assert problem["sku"] == "TEA"
    again = create(client, body, key)
    assert again["Idempotent-Replayed"] == "true"
    assert (stock_of("TEA"), stock_of("MUG")) == (1, 9)
    nothing_written()


@pytest.mark.django_db(transaction=True)  # autocommit, as a server runs the view
@pytest.mark.parametrize("mode", ["optional", "off"])
def test_out_of_stock_without_the_idempotency_layer_writes_nothing(
    alice, settings, mode
):
    """A deployment may make order creation's key optional, or turn the layer off
    (`IDEMPOTENCY_ENDPOINTS`): the request then runs in no transaction of the
    engine's. Refused for its stock, it once left the order behind, without its
    items, its number used up."""
    settings.IDEMPOTENCY_ENDPOINTS = {"orders.create": mode}
    _, client, _ = alice
    product("TEA", stock=1)
    number = preorder(client)
    body = {"merchant_order_no": number, "items": [{"sku": "TEA", "quantity": 2}]}
    refused = client.post("/api/v1/orders", body, format="json")
    assert_problem(refused, 409, "out_of_stock")
    assert stock_of("TEA") == 1
    nothing_written()
    # The number is still free: the order goes through once the stock is there.
    product("TEA", stock=2)
    placed = client.post("/api/v1/orders", body, format="json")
    assert placed.status_code == 201, placed.content
    assert stock_of("TEA") == 0
    assert ledger_report()["ok"]


def test_out_of_stock_over_the_api_names_the_first_short_line(alice):
    _, client, _ = alice
    product("AUD-C", stock=2)
    product("MUG", stock=5)
    lines = [("MUG", 1), ("AUD-C", 3), ("MUG", 5)]
    body = {
        "merchant_order_no": preorder(client),
        "items": [{"sku": sku, "quantity": quantity} for sku, quantity in lines],
    }
    problem = assert_problem(create(client, body), 409, "out_of_stock")
    assert problem["sku"] == "AUD-C"
    assert (stock_of("AUD-C"), stock_of("MUG")) == (2, 5)
    nothing_written()


def test_unknown_sku_and_mixed_currencies_over_the_api(alice):
    _, client, _ = alice
    product("TEA")
    product("USD-MUG", currency="USD")
    body = {
        "merchant_order_no": preorder(client),
        "items": [{"sku": "NOPE", "quantity": 1}],
    }
    assert assert_problem(create(client, body), 422, "product_unknown")["sku"] == "NOPE"
    mixed = [{"sku": "TEA", "quantity": 1}, {"sku": "USD-MUG", "quantity": 1}]
    body = {"merchant_order_no": preorder(client), "items": mixed}
    assert_problem(create(client, body), 422, "items_currency_mismatch")
    body = {
        "merchant_order_no": preorder(client),
        "items": [{"sku": "TEA", "quantity": 1}],
        "currency": "USD",
    }
    assert_problem(create(client, body), 422, "items_currency_mismatch")
    nothing_written()


def test_an_amount_too_large_is_refused(alice):
    _, client, _ = alice
    product("GOLD", price=10**15, stock=5)
    body = {
        "merchant_order_no": preorder(client),
        "items": [{"sku": "GOLD", "quantity": 2}],
    }
    assert_problem(create(client, body), 422, "order_amount_too_large")
    nothing_written()


ONE = [{"sku": "TEA", "quantity": 1}]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"items": [{"sku": "TEA", "quantity": 0}]}, "items"),
        ({"items": [{"sku": "TEA", "quantity": 1001}]}, "items"),
        ({"items": [{"sku": "TEA", "quantity": -1}]}, "items"),
        ({"items": [{"sku": "TEA", "quantity": 10**30}]}, "items"),
        ({"items": [{"sku": "TEA", "quantity": "1"}]}, "items"),
        ({"items": [{"sku": "TEA", "quantity": 1.0}]}, "items"),
        ({"items": [{"sku": "TEA", "quantity": True}]}, "items"),
        ({"items": [{"sku": 5, "quantity": 1}]}, "items"),
        ({"items": [{"sku": "X" * 65, "quantity": 1}]}, "items"),
        ({"items": [{"sku": "TEA"}]}, "items"),
        ({"items": [{"sku": "TEA", "quantity": 1, "price": 1}]}, "items"),
        ({"items": [["TEA", 1]]}, "items"),
        ({"items": ["TEA"]}, "items"),
        ({"items": [{"sku": f"S{n}", "quantity": 1} for n in range(51)]}, "items"),
        ({"items": []}, "items"),
        ({"items": {"sku": "TEA", "quantity": 1}}, "items"),
        ({"items": "TEA"}, "items"),
        ({"items": None}, "items"),
        ({"items": ONE, "amount": 100}, "items"),
        ({"items": ONE, "amount": 100}, "amount"),
        ({}, "amount"),
    ],
)
def test_bad_items_are_a_validation_problem(alice, extra, field):
    _, client, _ = alice
    product("TEA")
    key = new_key()
    body = {"merchant_order_no": preorder(client), **extra}
    problem = assert_problem(create(client, body, key), 400, "validation_error")
    assert field in problem["errors"], problem
    nothing_written()
    assert stock_of("TEA") == 5
    # refused for its form: the key stays free for the corrected request
    fixed = {"merchant_order_no": body["merchant_order_no"], "items": ONE}
    assert create(client, fixed, key).status_code == 201


# --- races (real threads, real transactions) --------------------------------------


@pytest.mark.django_db(transaction=True)
def test_thirty_shoppers_and_five_units(on_postgres):
    product("LAST", price=500, stock=5)
    shoppers = [customer(f"shopper{n}")[1] for n in range(30)]
    numbers = [preorder(client) for client in shoppers]

    def buy(i: int):
        body = {
            "merchant_order_no": numbers[i],
            "items": [{"sku": "LAST", "quantity": 1}],
        }
        response = create(shoppers[i], body)
        return response.status_code, response.json().get("code")

    results = run_in_threads(30, buy)
    assert sorted(results, key=str).count((201, None)) == 5, results
    assert results.count((409, "out_of_stock")) == 25, results
    assert stock_of("LAST") == 0
    assert Order.objects.count() == 5
    assert StockMovement.objects.filter(kind="order").count() == 5
    assert ledger_report()["ok"], ledger_report()["violations"]


@pytest.mark.django_db(transaction=True)
def test_opposite_orders_of_the_same_products_never_deadlock(on_postgres):
    product("A", stock=1000)
    product("B", stock=1000)
    clients = [customer(f"buyer{n}")[1] for n in range(20)]
    numbers = [preorder(client) for client in clients]

    def buy(i: int):
        lines = [{"sku": "A", "quantity": 1}, {"sku": "B", "quantity": 1}]
        body = {"merchant_order_no": numbers[i], "items": lines[:: 1 if i % 2 else -1]}
        return create(clients[i], body).status_code

    assert run_in_threads(20, buy) == [201] * 20
    assert (stock_of("A"), stock_of("B")) == (980, 980)


@pytest.mark.django_db(transaction=True)
def test_one_key_retried_at_once_takes_stock_once(on_postgres):
    product("TEA", stock=5)
    _, client, _ = customer("eve")
    body = {
        "merchant_order_no": preorder(client),
        "items": [{"sku": "TEA", "quantity": 2}],
    }
    key = new_key()
    results = run_in_threads(6, lambda i: create(client, body, key).status_code)
    assert set(results) <= {201, 409} and 201 in results, results
    assert stock_of("TEA") == 3


@pytest.mark.django_db(transaction=True)
def test_cancel_racing_pay_gives_stock_back_once_or_never(on_postgres):
    product("TEA", price=100, stock=50)
    for round_ in range(5):
        user, client, _ = customer(f"racer{round_}", balance=10_000)
        order = item_order(user, ("TEA", 3))
        no = order.merchant_order_no

        def act(i: int, no=no, client=client):
            path = f"/api/v1/orders/{no}/" + ("cancel" if i % 2 else "pay")
            body = {} if i % 2 else {"method": "balance"}
            return client.post(
                path, body, format="json", headers={"Idempotency-Key": new_key()}
            ).status_code

        results = run_in_threads(4, act)
        order.refresh_from_db()
        returns = StockMovement.objects.filter(
            reference=f"order:{order.pk}:return:{Product.objects.get(sku='TEA').pk}"
        ).count()
        if order.status == Order.Status.CANCELLED:
            assert returns == 1, results
        else:
            assert order.status == Order.Status.PAID and returns == 0, results
    taken = 3 * Order.objects.exclude(status=Order.Status.CANCELLED).count()
    assert stock_of("TEA") == 50 - taken
    assert ledger_report()["ok"], ledger_report()["violations"]


@pytest.mark.django_db(transaction=True)
def test_duplicated_cancels_and_expiry_at_once_give_back_once(on_postgres):
    product("TEA", stock=10)
    user, client, _ = customer("frank")
    order = item_order(user, ("TEA", 4))
    Order.objects.filter(pk=order.pk).update(
        created_at=timezone.now() - timedelta(hours=2)
    )
    key = new_key()
    path = f"/api/v1/orders/{order.merchant_order_no}/cancel"

    def act(i: int):
        if i < 3:
            return order_cancel_expired(older_than_seconds=60)
        headers = {"Idempotency-Key": key if i < 6 else new_key()}
        return client.post(path, {}, format="json", headers=headers).status_code

    results = run_in_threads(8, act)
    assert stock_of("TEA") == 10, results
    assert StockMovement.objects.filter(kind="return").count() == 1
    assert Order.objects.get(pk=order.pk).status == Order.Status.CANCELLED
    assert PreOrder.objects.count() == 1


# --- the web order form -------------------------------------------------------------


def web_form(client) -> tuple[str, dict]:
    """GET /orders/new (redirected to the form naming its token): the token and
    the quantity field of each product on offer, by SKU."""
    page = client.get(client.get("/orders/new")["Location"])
    form = page.context["form"]
    fields = {p.sku: form.quantity_field(p) for p in form.products}
    return form["token"].value(), fields


def test_web_order_with_products_once_per_form(client, alice):
    user, _, _ = alice
    client.force_login(user)
    product("TEA", price=1200, stock=5)
    product("MUG", price=450, stock=5)
    token, fields = web_form(client)
    # "2.0": a browser's number box sends a whole number as it was typed.
    post = {"token": token, fields["TEA"]: "2.0", fields["MUG"]: "", "description": ""}
    first = client.post("/orders/new", post)
    again = client.post("/orders/new", post)  # the double click
    assert first.status_code == again.status_code == 303
    assert first["Location"] == again["Location"] == f"/orders/{token}"
    order = Order.objects.get()
    assert order.amount == 2400
    assert [(i.sku, i.quantity) for i in order.items.all()] == [("TEA", 2)]
    assert stock_of("TEA") == 3
    page = client.get(first["Location"])
    assert b'data-sku="TEA"' in page.content and "¥24.00" in page.content.decode()
    # the form of a placed order shows what was ordered
    shown = client.get(f"/orders/new?token={token}")
    assert shown.context["form"].initial[fields["TEA"]] == 2
    # cancelled on the web: the stock comes back
    assert client.post(f"/orders/{token}/cancel").status_code == 303
    assert stock_of("TEA") == 5


def shown_prices(page) -> dict[str, str]:
    """The prices the form's page showed, as the browser sends them back."""
    return dict(re.findall(r'name="(price_[0-9]+)" value="([0-9]+)"', page))


def test_a_web_form_whose_price_changed_orders_nothing(client, alice):
    """The shopper chose at the price the form showed: a price changed since is
    never charged unseen; the form comes back with the new price, and the same
    form sent again (its token unused) then orders at it."""
    user, _, _ = alice
    client.force_login(user)
    product("TEA", price=1200, stock=5)
    page = client.get(client.get("/orders/new")["Location"])
    field = page.context["form"].quantity_field(Product.objects.get(sku="TEA"))
    post = {
        "token": page.context["form"]["token"].value(),
        field: "2",
        **shown_prices(page.content.decode()),
    }
    Product.objects.filter(sku="TEA").update(price=9900)  # staff raised it meanwhile
    shown = client.post("/orders/new", post)
    assert shown.status_code == 200
    assert "The price of TEA name changed" in shown.content.decode()
    assert "¥99.00" in shown.content.decode()
    assert not Order.objects.exists() and stock_of("TEA") == 5
    again = {**post, **shown_prices(shown.content.decode())}
    assert client.post("/orders/new", again).status_code == 303
    assert Order.objects.get().amount == 19800


def test_a_web_form_naming_a_product_no_longer_offered_orders_nothing(client, alice):
    """A product the form offered has left the form's catalogue since (another
    currency now): never an order of the rest without it."""
    user, _, _ = alice
    client.force_login(user)
    product("TEA", price=1200, stock=5)
    product("MUG", price=450, stock=5)
    token, fields = web_form(client)
    Product.objects.filter(sku="MUG").update(currency="USD")
    shown = client.post(
        "/orders/new", {"token": token, fields["TEA"]: "1", fields["MUG"]: "2"}
    )
    assert shown.status_code == 200
    assert "no longer offered" in shown.content.decode()
    assert not Order.objects.exists()
    assert (stock_of("TEA"), stock_of("MUG")) == (5, 5)


def test_web_orders_from_two_tabs_of_one_form_are_both_placed(client, alice):
    user, _, _ = alice
    client.force_login(user)
    product("TEA", price=1200, stock=5)
    product("MUG", price=450, stock=5)
    token, fields = web_form(client)
    assert web_form(client)[0] == token  # the second tab shows the same form
    tea = {"token": token, fields["TEA"]: "1", fields["MUG"]: ""}
    mug = {"token": token, fields["TEA"]: "", fields["MUG"]: "2"}
    assert client.post("/orders/new", tea).status_code == 303
    shown = client.post("/orders/new", mug)  # the second tab's order
    assert shown.status_code == 200
    assert f"already placed order {token}" in shown.content.decode()
    assert stock_of("MUG") == 5
    again = shown.context["form"]
    assert again.initial[fields["MUG"]] == 2
    placed = client.post("/orders/new", {**mug, "token": again["token"].value()})
    assert placed.status_code == 303
    lines = [[(i.sku, i.quantity) for i in o.items.all()] for o in Order.objects.all()]
    assert sorted(lines) == [[("MUG", 2)], [("TEA", 1)]]
    assert (stock_of("TEA"), stock_of("MUG")) == (4, 3)
    # the first tab's order sent again is still that order, not a third
    assert client.post("/orders/new", tea)["Location"] == f"/orders/{token}"
    assert Order.objects.count() == 2


def test_web_order_over_the_largest_amount_says_so(client, alice):
    from orders.fields import MAX_AMOUNT

    user, _, _ = alice
    client.force_login(user)
    product("GOLD", price=MAX_AMOUNT, stock=5)
    token, fields = web_form(client)
    response = client.post("/orders/new", {"token": token, fields["GOLD"]: "2"})
    assert response.status_code == 200
    assert "would cost more than one order may" in response.content.decode()
    nothing_written()
    assert stock_of("GOLD") == 5


def test_web_order_out_of_stock_shows_the_form_again(client, alice):
    user, _, _ = alice
    client.force_login(user)
    product("TEA", stock=1)
    token, fields = web_form(client)
    response = client.post("/orders/new", {"token": token, fields["TEA"]: "2"})
    assert response.status_code == 200
    assert "Not enough TEA left" in response.content.decode()
    assert response.context["form"]["token"].value() == token
    nothing_written()
    assert (
        client.post("/orders/new", {"token": token, fields["TEA"]: "1"}).status_code
        == 303
    )
    assert stock_of("TEA") == 0


@pytest.mark.parametrize(
    ("quantity", "amount"),
    [
        ("2", "5.00"),
        ("0", ""),
        ("", ""),
        ("-1", ""),
        ("1001", ""),
        ("x", ""),
        *((typed, "") for typed in ("1e2", "1_0", "+2", "٢", "2.5")),
    ],
)
def test_web_order_bad_choices(client, alice, quantity, amount):
    user, _, _ = alice
    client.force_login(user)
    product("TEA", stock=5)
    token, fields = web_form(client)
    post = {"token": token, fields["TEA"]: quantity, "amount": amount}
    response = client.post("/orders/new", post)
    assert response.status_code == 200
    assert response.context["form"].errors
    assert response.context["form"].products  # the products are still offered
    nothing_written()
    assert stock_of("TEA") == 5


def test_the_product_form_speaks_chinese(client, alice):
    user, _, _ = alice
    client.force_login(user)
    product("TEA", stock=5)
    client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/orders"})
    page = client.get(client.get("/orders/new")["Location"]).content.decode()
    assert "选择商品" in page and "剩余 5 件" in page


def test_demo_data_includes_products_with_stock(settings, tmp_path):
    from ledger.demo import demo_seed

    settings.DATA_DIR = tmp_path
    demo_seed()
    shown = demo_seed()["products"]  # every `make run` seeds again: idempotent
    assert len(shown) >= 3 and all(p["stock"] > 0 for p in shown)
    assert Product.objects.count() == len(shown)
    assert ledger_report()["ok"], ledger_report()["violations"]


@pytest.mark.django_db(transaction=True)
def test_the_expiry_sweep_takes_products_in_id_order_across_its_orders(
    on_postgres, alice, settings
):
    """An order being placed locks its products in id order; so does the sweep,
    across all the orders of its batch, so the two never wait for each other in a
    circle. Here an order holds LOW (and would want HIGH next) while the sweep's
    batch has an order of HIGH before an order of LOW: the sweep waits for LOW
    without having taken HIGH."""
    user, _, _ = alice
    low, high = product("LOW", stock=5), product("HIGH", stock=5)
    first, second = item_order(user, ("HIGH", 1)), item_order(user, ("LOW", 1))
    Order.objects.filter(pk__in=[first.pk, second.pk]).update(
        created_at=timezone.now() - timedelta(hours=2)
    )
    settings.ORDER_UNPAID_EXPIRY_SECONDS = 3600
    with row_locked(Product, low.pk):
        sweep = Background(cancel_expired_orders)
        sweep.start()
        wait_for(blocked_on_lock, 30, "the sweep waiting for LOW")
        db = connection.settings_dict
        with psycopg.connect(
            dbname=db["NAME"], user=db["USER"], host=db["HOST"], port=db["PORT"]
        ) as placing:
            placing.execute(
                "SELECT 1 FROM orders_product WHERE id = %s FOR UPDATE NOWAIT",
                [high.pk],
            )  # HIGH is free: no circle
            placing.rollback()
    assert sweep.outcome() == 2
    assert (stock_of("LOW"), stock_of("HIGH")) == (5, 5)
