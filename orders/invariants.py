"""The orders app's invariants for `check_ledger` (see `ledger.invariants`): stock is
to goods what a balance is to money."""

from django.db.models import F, Sum
from django.db.models.functions import Coalesce

from ledger.invariants import invariant

from .models import Product


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
