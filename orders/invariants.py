"""The orders app's invariants for `check_ledger` (see `ledger.invariants`): stock is
to goods what a balance is to money, and it follows the orders that take it."""

from django.db.models import CharField, Exists, F, OuterRef, Sum, Value
from django.db.models.functions import Cast, Coalesce, Concat

from ledger.invariants import invariant

from .models import Order, OrderItem, Product, StockMovement


@invariant
def stock_matches_movements() -> list[str]:
    drifted = (
        Product.objects.annotate(moved=Coalesce(Sum("movements__quantity"), 0))
        .exclude(stock=F("moved"))
        .values_list("sku", "stock", "moved")
    )
    return [
        f"product {sku!r} stock {stock} != sum of its stock movements {moved}"
        for sku, stock, moved in drifted
    ]


@invariant
def no_negative_stock() -> list[str]:
    # The check constraint refuses it; this proves nobody dropped the constraint.
    negative = Product.objects.filter(stock__lt=0).values_list("sku", "stock")
    return [f"product {sku!r} stock is below zero: {stock}" for sku, stock in negative]


@invariant
def stock_follows_orders() -> list[str]:
    """The stock an order's lines took is back exactly when the order is cancelled
    (by its owner, staff or the expiry of an unpaid order or of its hold), never
    for an order paid or pending: each line's return movement (`order:<order>:
    return:<product>`, see `orders.services._give_back`) exists for the lines of
    cancelled orders only. The stock's total still equals its movements either way
    (`stock_matches_movements`), so only this check sees it."""
    returned = Exists(
        StockMovement.objects.filter(
            reference=Concat(
                Value("order:"),
                Cast(OuterRef("order_id"), CharField()),
                Value(":return:"),
                Cast(OuterRef("product_id"), CharField()),
            )
        )
    )
    lines = OrderItem.objects.order_by("order_id", "sku").values_list(
        "order__merchant_order_no", "order__status", "quantity", "sku"
    )
    cancelled = Order.Status.CANCELLED
    kept = lines.filter(order__status=cancelled).exclude(returned)
    given_back = lines.exclude(order__status=cancelled).filter(returned)
    return [
        f"order {no} is cancelled but its {quantity} {sku} never came back"
        for no, _, quantity, sku in kept
    ] + [
        f"order {no} is {Order.Status(status).name.lower()} but its {quantity} {sku} "
        "came back"
        for no, status, quantity, sku in given_back
    ]
