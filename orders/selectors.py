from django.contrib.auth.models import AbstractBaseUser, User
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from .models import Order, PreOrder, Product, StockMovement


def order_list(
    *, owner: AbstractBaseUser, status: int | None = None, with_items: bool = False
) -> QuerySet[Order]:
    """The owner's orders, newest first; only those in `status` when given; with
    their items read in one statement a page when they are shown."""
    orders = Order.objects.filter(owner=owner)
    if status is not None:
        orders = orders.filter(status=status)
    if with_items:
        orders = orders.prefetch_related("items")
    return orders.order_by("-id")


def order_get(*, owner: AbstractBaseUser, merchant_order_no: str) -> Order:
    """The owner's order with that number; 404 for anyone else's or an unknown one."""
    return get_object_or_404(Order, owner=owner, merchant_order_no=merchant_order_no)


def order_find(*, owner: AbstractBaseUser, merchant_order_no: str) -> Order | None:
    """The owner's order with that number, or None."""
    return Order.objects.filter(
        owner=owner, merchant_order_no=merchant_order_no
    ).first()


def order_contents(order: Order) -> tuple[object, ...]:
    """What `order` was placed for, to compare with `OrderForm.contents()`: its lines
    (sku, quantity) or its free amount, and its description."""
    lines = sorted((item.sku, item.quantity) for item in order.items.all())
    if lines:
        return ("items", tuple(lines), order.description)
    return ("amount", order.amount, order.currency, order.description)


def preorder_find(*, owner: User, merchant_order_no: str) -> PreOrder | None:
    """The pre-order that issued that number to the owner, or None; `expired` says
    whether it has (by the database's clock)."""
    if not merchant_order_no:
        return None
    return (
        PreOrder.objects.filter(owner=owner, merchant_order_no=merchant_order_no)
        .judged()
        .first()
    )


def product_list() -> QuerySet[Product]:
    """The catalogue, by SKU."""
    return Product.objects.order_by("sku")


def stock_adjustment_matches(*, reference: str, quantity: int, note: str) -> bool:
    """Whether the adjustment made under `reference` (see `stock_adjust`) moved
    `quantity` units with `note`: the same form sent again, not one changed since."""
    return StockMovement.objects.filter(
        reference=f"adjust:{reference}", quantity=quantity, note=note
    ).exists()
