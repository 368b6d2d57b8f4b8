"""Every change to orders and pre-orders.

These services open plain `transaction.atomic()` blocks, never durable ones: the
idempotency engine runs them inside the transaction that also stores the response, so
the order and "this key is done" commit together.
"""

from collections.abc import Callable, Sequence
from datetime import timedelta
from uuid import uuid4

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Exists, F, OuterRef, QuerySet
from django.utils import timezone
from django_fsm import ConcurrentTransition, can_proceed

from idempotency.snowflake import next_snowflake
from idempotency.sql import DatabaseNow, delete_in_batches, insert_unless_exists
from ledger.currencies import currency_supported
from ledger.exceptions import DomainError

from .exceptions import (
    DuplicateOrder,
    ItemsCurrencyMismatch,
    MerchantOrderNoUnknown,
    OrderAlreadyCancelled,
    OrderAlreadyPaid,
    OrderAmountTooLarge,
    OrderAuthorized,
    OrderNotCancellable,
    OrderNotPayable,
    OrderTransitionNotAllowed,
    OutOfStock,
    ProductUnknown,
)
from .fields import MAX_AMOUNT as MAX_ORDER_AMOUNT
from .models import (
    PAYABLE_STATES,
    REFUNDABLE_STATES,
    Order,
    OrderItem,
    PreOrder,
    Product,
    StockMovement,
)

# What apps above this one release before an authorized order is cancelled: the
# payments app registers the void of the order's authorized payment and its hold (in
# its `AppConfig.ready()`), so this app never imports it. Each releaser gets the id
# of an order the caller holds locked and runs in the caller's transaction.
OrderReleaser = Callable[[int], None]
_releasers: list[OrderReleaser] = []


def order_releaser(releaser: OrderReleaser) -> OrderReleaser:
    """Register `releaser(order_id)`, run before an authorized order is cancelled."""
    if releaser not in _releasers:
        _releasers.append(releaser)
    return releaser


# What apps above this one do when orders have been cancelled (by `order_cancel`, or
# by the expiry of unpaid ones), in the transaction that cancelled them, the orders
# still locked: the payments app has their open provider charges cancelled once it
# commits. A listener gets the ids of every order the transaction cancelled.
OrderCancelListener = Callable[[list[int]], None]
_cancel_listeners: list[OrderCancelListener] = []


def order_cancel_listener(listener: OrderCancelListener) -> OrderCancelListener:
    """Register `listener(order_ids)`, run when orders have been cancelled."""
    if listener not in _cancel_listeners:
        _cancel_listeners.append(listener)
    return listener


def preorder_create(*, owner: User) -> PreOrder:
    """Issue a fresh merchant order number to `owner`, usable until it expires.

    The number is a Snowflake id: unique without asking the database, roughly ordered
    by time. The row records who may use it and until when, by the database's clock,
    which `order_create` and the purge read too: a host whose clock runs slow or
    fast neither shortens a number's life nor lengthens it past the purge's grace.
    """
    preorder = PreOrder(merchant_order_no=str(next_snowflake()), owner=owner)
    ttl = timedelta(seconds=settings.PREORDER_TTL_SECONDS)
    if not insert_unless_exists(
        preorder, ("merchant_order_no",), clock={"expires_at": ttl}
    ):
        raise RuntimeError(f"merchant order number {preorder} issued twice")
    return preorder


ItemLine = tuple[str, int]  # (sku, quantity)


def order_create(
    *,
    owner: User,
    merchant_order_no: str,
    amount: int | None = None,
    currency: str | None = None,
    description: str = "",
    items: Sequence[ItemLine] | None = None,
) -> Order:
    """Create the order for a number a pre-order issued to `owner`, at most once.

    Either an `amount` (with its `currency`) or `items`, `(sku, quantity)` lines whose
    products set the amount and the currency and whose stock is taken here, in the
    caller's transaction (see `_order_take_stock`), or in one of its own when there
    is none; not enough of any line raises `OutOfStock` and the caller's
    transaction must roll back (the API's and the web form's do), so nothing is
    taken and no order is left.

    A number this caller was never issued, or one that expired unused, is refused. A
    second order for the same number is refused with `DuplicateOrder`, which names the
    existing order. The unique constraint on (owner, merchant_order_no) decides, in one
    `INSERT ... ON CONFLICT DO NOTHING`: a retry, a double click and two racing
    requests all lose the same way, without a savepoint or an exception.
    """
    if (amount is None) == (items is None):
        raise ValueError("an order has either an amount or items")
    lines: list[OrderItem] = []
    if items is not None:
        lines, amount, currency = _order_lines(items, currency)
    if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
        raise ValueError("an order amount is a positive integer of minor units")
    if currency is None or not currency_supported(currency):
        raise ValueError(f"the ledger does not hold {currency!r}")
    preorder = (
        PreOrder.objects.filter(merchant_order_no=merchant_order_no, owner=owner)
        .judged()
        .first()
    )
    if preorder is None:
        raise MerchantOrderNoUnknown()
    if preorder.expired:
        placed = Order.objects.filter(owner=owner, merchant_order_no=merchant_order_no)
        if placed.exists():
            raise DuplicateOrder(merchant_order_no=merchant_order_no)
        raise MerchantOrderNoUnknown(
            f"Merchant order number {merchant_order_no} expired unused at "
            f"{preorder.expires_at.isoformat()}; ask for a new one."
        )
    order = Order(
        owner=owner,
        merchant_order_no=merchant_order_no,
        amount=amount,
        currency=currency,
        description=description,
    )
    if items is None:  # one statement, atomic on its own
        placed = insert_unless_exists(order, ("owner_id", "merchant_order_no"))
    else:  # `lines` has one or more
        # The order with its items and their stock, or nothing: also for a caller
        # that runs in no transaction (the API with its key optional and none sent).
        with transaction.atomic(savepoint=False):
            placed = insert_unless_exists(order, ("owner_id", "merchant_order_no"))
            if placed:
                for line in lines:
                    line.order = order
                OrderItem.objects.bulk_create(lines)
                _order_take_stock(order, lines, items)
    if not placed:
        raise DuplicateOrder(merchant_order_no=merchant_order_no)
    # What the response shows, without asking the database again.
    order._prefetched_objects_cache = {"items": _known_items(order, lines)}  # type: ignore[attr-defined]
    return order


def _known_items(order: Order, rows: list[OrderItem]) -> QuerySet[OrderItem]:
    """The order's items as a prefetch leaves them: answered from `rows`, no query."""
    queryset = OrderItem.objects.filter(order=order)
    queryset._result_cache = rows
    queryset._prefetch_done = True  # type: ignore[attr-defined]
    return queryset


def _order_lines(
    items: Sequence[ItemLine], currency: str | None
) -> tuple[list[OrderItem], int, str]:
    """The order's lines (one per product, quantities of a repeated sku added up, in
    the order first named), its amount and its currency, from one read of the
    products."""
    wanted: dict[str, int] = {}
    for sku, quantity in items:
        if isinstance(quantity, bool) or not isinstance(quantity, int) or quantity < 1:
            raise ValueError("a line's quantity is a positive integer")
        wanted[sku] = wanted.get(sku, 0) + quantity
    if not wanted:
        raise ValueError("an order with items has at least one")
    products = Product.objects.in_bulk(list(wanted), field_name="sku")
    lines = []
    for sku, quantity in wanted.items():
        product = products.get(sku)
        if product is None:
            raise ProductUnknown(sku=sku)
        lines.append(
            OrderItem(
                product=product,
                sku=product.sku,
                name=product.name,
                quantity=quantity,
                price=product.price,
            )
        )
    currencies = {line.product.currency for line in lines}
    if len(currencies) != 1 or (currency is not None and currency not in currencies):
        raise ItemsCurrencyMismatch()
    amount = sum(line.amount for line in lines)
    if amount > MAX_ORDER_AMOUNT:
        raise OrderAmountTooLarge()
    return lines, amount, currencies.pop()


def _order_take_stock(
    order: Order, lines: list[OrderItem], requested: Sequence[ItemLine]
) -> None:
    """Take each line's quantity from its product's stock, or refuse them all.

    Products are moved in id order, so two orders for the same products never wait
    for each other in a circle. Each take is a movement with a reference unique to
    (order, product) and a conditional decrement (`stock_move`). When a line is
    short, `OutOfStock` names the first line of `requested` (the lines as the caller
    named them, before a repeated sku was added up) at which the quantity asked for
    its sku so far exceeds the stock (the lines already taken are counted as still
    there: the caller's rollback gives them back).
    """
    taken: dict[int, int] = {}
    for line in sorted(lines, key=lambda line: line.product_id):
        moved = _stock_apply(
            line.product_id,
            -line.quantity,
            f"order:{order.pk}:take:{line.product_id}",
            StockMovement.Kind.ORDER,
        )
        if moved is None:
            short = line
            break
        taken[line.product_id] = line.quantity
    else:
        return
    left = dict(
        Product.objects.filter(pk__in=[line.product_id for line in lines]).values_list(
            "pk", "stock"
        )
    )
    by_sku = {line.sku: line for line in lines}
    asked: dict[str, int] = {}
    for sku, quantity in requested:
        line = by_sku[sku]
        asked[sku] = asked.get(sku, 0) + quantity
        stock = left[line.product_id] + taken.get(line.product_id, 0)
        if asked[sku] > stock:
            raise OutOfStock(sku=sku, quantity=line.quantity, stock=stock)
    # Restocked between the take that failed and this read: that line was short.
    raise OutOfStock(
        sku=short.sku, quantity=short.quantity, stock=left[short.product_id]
    )


# What an order is once it took each edge, for a refusal's detail ("it cannot be
# shipped"): the edge's name is a verb, and "it cannot complete" says something else.
_TRANSITION_DONE = {
    "pay": "paid",
    "authorize": "authorized",
    "capture": "captured",
    "ship": "shipped",
    "complete": "completed",
    "cancel": "cancelled",
    "refund": "refunded",
}


def _order_transition(
    order_id: int,
    name: str,
    refusal: Callable[[Order], type[DomainError]] = lambda _: OrderTransitionNotAllowed,
    before: Callable[[Order], None] | None = None,
) -> Order:
    """Lock the order, take the declared edge `name` (after `before(order)`), save;
    if the edge cannot be taken, raise the error `refusal(order)` names.

    The row lock serialises transitions of one order; the save is also conditional on
    the status we read (ConcurrentTransitionMixin), the guard for any caller that did
    not lock.
    """
    with transaction.atomic(savepoint=False):
        order = Order.objects.select_for_update().get(pk=order_id)
        move = getattr(order, name)
        if not can_proceed(move):
            # Decided here, under the lock: the caller's transaction can run no query
            # once this leaves it.
            raise refusal(order)(
                f"Order {order.merchant_order_no} is {order.status_name}; "
                f"it cannot be {_TRANSITION_DONE[name]}."
            )
        if before is not None:
            before(order)
        changed = refusal(order)  # (named by the status read, not the one moved to)
        move()
        try:
            order.save(update_fields=["status", "updated_at"])
        except ConcurrentTransition:
            raise changed(
                f"Order {order.merchant_order_no} changed while we moved it; "
                "read it again."
            ) from None
    return order


def order_cancel(*, order_id: int) -> Order:
    """Cancel an order that is still pending payment or authorized; anything else is
    refused.

    An authorized order's hold is voided first, in the same transaction and under
    the order's row lock (the registered releasers: the payments app voids the
    authorized payment and releases its hold), so a cancelled order never keeps
    money held. The stock its items took comes back in the same transaction, once
    (see `order_give_back_stock`). Then the registered cancel listeners run (the
    payments app cancels an open provider charge after commit).
    """
    with transaction.atomic(savepoint=False):
        order = _order_transition(order_id, "cancel", _cancel_refusal, _release)
        lines = list(OrderItem.objects.filter(order_id=order.pk).order_by("pk"))
        _give_back(lines)
        for listener in _cancel_listeners:
            listener([order.pk])
    order._prefetched_objects_cache = {"items": _known_items(order, lines)}  # type: ignore[attr-defined]
    return order


def _release(order: Order) -> None:
    if order.status == Order.Status.AUTHORIZED:
        for release in _releasers:
            release(order.pk)


def order_give_back_stock(*, order_id: int) -> int:
    """Give back the stock a cancelled order's items took; return how many lines
    came back.

    The caller has moved the order to `cancelled` in its transaction: this never
    looks at the status (a paid order's stock must never come back, so only the
    cancellations call it).
    """
    return _give_back(list(OrderItem.objects.filter(order_id=order_id)))


def _give_back(lines: list[OrderItem]) -> int:
    """Each line (of one order or of several) comes back through a movement whose
    reference is unique to (order, product, "return"): a second call, a retried
    task or a racing cancellation moves nothing. Products are locked in id order
    across all the lines, as an order takes them, so a sweep of many orders never
    deadlocks with an order being placed."""
    returned = 0
    with transaction.atomic(savepoint=False):
        for line in sorted(lines, key=lambda line: (line.product_id, line.order_id)):
            returned += stock_move(
                product_id=line.product_id,
                quantity=line.quantity,
                reference=f"order:{line.order_id}:return:{line.product_id}",
                kind=StockMovement.Kind.RETURN,
            )
    return returned


def _cancel_refusal(order: Order) -> type[DomainError]:
    """A cancel of a cancelled order is a repeat, which the shop's page says as
    such (`OrderAlreadyCancelled`); of any other, a refusal."""
    if order.status == Order.Status.CANCELLED:
        return OrderAlreadyCancelled
    return OrderNotCancellable


def order_ship(*, order_id: int) -> Order:
    """Mark a paid order shipped."""
    return _order_transition(order_id, "ship")


def order_complete(*, order_id: int) -> Order:
    """Mark a shipped order completed."""
    return _order_transition(order_id, "complete")


def order_lock_for_payment(*, order_id: int) -> Order:
    """Lock the order for a payment, refusing one it cannot take: already paid
    (`OrderAlreadyPaid`) or cancelled (`OrderNotPayable`). The caller's transaction
    holds the row lock until it commits the payment and `order_mark_paid`."""
    order = Order.objects.select_for_update().get(pk=order_id)
    order_check_payable(order)
    return order


def order_check_payable(order: Order) -> None:
    """Refuse a payment the order, as read, cannot take: already paid
    (`OrderAlreadyPaid`), authorized (`OrderAuthorized`, an `OrderNotPayable`) or
    cancelled (`OrderNotPayable`). The refusals of a pay request, also for one that
    finds its order changed when it resumes."""
    if order_takes_payment(order):
        return
    if order.is_paid:
        raise OrderAlreadyPaid()
    if order.status == Order.Status.AUTHORIZED:
        raise OrderAuthorized(
            f"Order {order.merchant_order_no} is authorized: capture or void its "
            "payment."
        )
    raise OrderNotPayable()


def order_takes_payment(order: Order) -> bool:
    """Whether the order may still be paid: its `pay` edge is open."""
    return can_proceed(order.pay)


def order_mark_paid(*, order_id: int) -> bool:
    """Take the `pay` edge unless the order is already past it; True if it moved.

    One conditional `UPDATE ... WHERE status IN (the edge's sources)`: a late or
    repeated payment confirmation can never move a shipped, cancelled or refunded
    order backwards.
    """
    now = timezone.now()
    return bool(
        Order.objects.filter(pk=order_id, status__in=PAYABLE_STATES).update(
            status=Order.Status.PAID, paid_at=now, updated_at=now
        )
    )


def order_mark_authorized(*, order_id: int) -> bool:
    """Take the `authorize` edge from `pending_payment`; True if it moved (one
    conditional `UPDATE ... WHERE status = pending_payment`)."""
    return bool(
        Order.objects.filter(pk=order_id, status=Order.Status.PENDING_PAYMENT).update(
            status=Order.Status.AUTHORIZED, updated_at=timezone.now()
        )
    )


def order_mark_captured(*, order_id: int) -> bool:
    """Take the `capture` edge from `authorized` to `paid`; True if it moved (one
    conditional `UPDATE ... WHERE status = authorized`)."""
    now = timezone.now()
    return bool(
        Order.objects.filter(pk=order_id, status=Order.Status.AUTHORIZED).update(
            status=Order.Status.PAID, paid_at=now, updated_at=now
        )
    )


def order_mark_refunded(*, order_id: int) -> bool:
    """Take the `refund` edge from a paid, shipped or completed order; True if it
    moved.

    One conditional `UPDATE ... WHERE status IN (the edge's sources)`, so a repeated
    refund, or one racing a cancellation, can never move it twice.
    """
    return bool(
        Order.objects.filter(pk=order_id, status__in=REFUNDABLE_STATES).update(
            status=Order.Status.REFUNDED, updated_at=timezone.now()
        )
    )


def order_cancel_expired(*, older_than_seconds: int, batch: int = 500) -> int:
    """Cancel orders still unpaid `older_than_seconds` after they were placed, and
    give back the stock they took.

    In batches, each its own transaction: the batch's orders still pending payment
    are locked (in id order) and re-checked under the lock, so an order paid
    meanwhile is never touched and one a payment is about to take waits for us and
    is then refused as cancelled. A provider success arriving after this is refunded
    by the payments app. Running twice cancels and gives back nothing the second
    time. An authorized order expires with its hold instead (the payments app's hold
    expiry voids the hold, then cancels the order through `order_cancel`), so this
    never cancels an order that still holds money. The cancel listeners run for each
    batch, as for `order_cancel`: an order that expired with its provider payment open
    has the charge cancelled, so its pay page no longer takes money. Returns how many
    were cancelled.
    """
    # By the database's clock, which stamps the orders: a beat host's clock running
    # fast cancelled them early.
    cutoff = DatabaseNow(plus=-timedelta(seconds=older_than_seconds))
    cancelled = 0
    while True:
        with transaction.atomic():
            ids = list(
                Order.objects.filter(
                    status=Order.Status.PENDING_PAYMENT, created_at__lt=cutoff
                )
                .order_by("pk")
                .values_list("pk", flat=True)[:batch]
            )
            if not ids:
                return cancelled
            locked = list(
                Order.objects.filter(pk__in=ids, status=Order.Status.PENDING_PAYMENT)
                .order_by("pk")
                .select_for_update()
                .values_list("pk", flat=True)
            )
            Order.objects.filter(pk__in=locked).update(
                status=Order.Status.CANCELLED, updated_at=timezone.now()
            )
            _give_back(list(OrderItem.objects.filter(order_id__in=locked)))
            for listener in _cancel_listeners:
                listener(locked)
        cancelled += len(locked)


# The shortest grace the purge accepts. `order_create` checks a number's expiry and
# then inserts the order, which stays invisible to the purge until its transaction
# commits: a number that expired during such a transaction must not be purged under
# it. Ten minutes is far longer than any request may run (gunicorn's timeout and the
# idempotency lease are 30 s).
PREORDER_PURGE_MIN_GRACE_SECONDS = 600


def preorder_purge_expired(
    *, grace_seconds: int, batch_size: int = 1000, max_seconds: float = 30.0
) -> int:
    """Delete pre-orders that expired unused more than `grace_seconds` ago.

    A number that was used keeps its row (the order's history names it). Until the
    grace has passed, a late request still hears "expired", not "unknown". No order
    can appear for a number expired longer than the grace (see
    `PREORDER_PURGE_MIN_GRACE_SECONDS`), so what is picked stays unused. In batches
    (see `delete_in_batches`); returns how many went.
    """
    if grace_seconds < PREORDER_PURGE_MIN_GRACE_SECONDS:
        raise ValueError(
            f"a grace of {grace_seconds} s could purge a number an order is being "
            f"created for; use at least {PREORDER_PURGE_MIN_GRACE_SECONDS} s"
        )
    cutoff = DatabaseNow(plus=-timedelta(seconds=grace_seconds))
    # By owner and number: the orders' unique index answers each probe.
    used = Order.objects.filter(
        owner=OuterRef("owner"), merchant_order_no=OuterRef("merchant_order_no")
    )
    unused = PreOrder.objects.filter(expires_at__lt=cutoff).exclude(Exists(used))
    return delete_in_batches(unused, batch_size=batch_size, max_seconds=max_seconds)


def product_get_or_create(
    *, sku: str, name: str, price: int, currency: str
) -> tuple[Product, bool]:
    """The product with this SKU, created with the rest if there is none (True then).

    One `INSERT ... ON CONFLICT DO NOTHING` on the unique SKU: running it again, or
    twice at once, finds the same product and changes nothing of it.
    """
    if isinstance(price, bool) or not isinstance(price, int) or price <= 0:
        raise ValueError("a price is a positive integer of minor units")
    if not currency_supported(currency):
        raise ValueError(f"the ledger does not hold {currency!r}")
    product = Product(sku=sku, name=name, price=price, currency=currency)
    if insert_unless_exists(product, ("sku",)):
        return product, True
    return Product.objects.get(sku=sku), False


def stock_move(
    *, product_id: int, quantity: int, reference: str, kind: str, note: str = ""
) -> bool:
    """Record a stock movement and move the product's stock by `quantity`, once per
    `reference`; False if the reference was used before (nothing moves then).

    The movement is inserted first (`INSERT ... ON CONFLICT DO NOTHING` on its unique
    reference): a replay, a retry or a racing duplicate stops there. Then one
    conditional `UPDATE products SET stock = stock + :q WHERE id = :id AND stock >=
    -:q` (the condition only when taking), never read-modify-write. Taking more than
    there is raises `OutOfStock`; the movement is then already written and the
    caller's transaction must roll back (as an exception does in every entry point).
    """
    with transaction.atomic(savepoint=False):
        moved = _stock_apply(product_id, quantity, reference, kind, note)
        if moved is None:
            product = Product.objects.get(pk=product_id)
            raise OutOfStock(sku=product.sku, quantity=-quantity, stock=product.stock)
    return moved


def _stock_apply(
    product_id: int, quantity: int, reference: str, kind: str, note: str = ""
) -> bool | None:
    """`stock_move` without the refusal: None when there is not enough stock (the
    movement is written: roll back)."""
    if isinstance(quantity, bool) or not isinstance(quantity, int) or quantity == 0:
        raise ValueError("a stock movement moves a non-zero integer quantity")
    movement = StockMovement(
        product_id=product_id,
        quantity=quantity,
        reference=reference,
        kind=kind,
        note=note,
    )
    if not insert_unless_exists(movement, ("reference",)):
        return False
    products = Product.objects.filter(pk=product_id)
    if quantity < 0:
        products = products.filter(stock__gte=-quantity)
    if not products.update(stock=F("stock") + quantity, updated_at=timezone.now()):
        return None
    return True


def stock_top_up(*, product_id: int, at_least: int) -> StockMovement | None:
    """Receive whatever brings the product's stock up to `at_least`; nothing if it
    has that.

    The row is locked while we decide, and the movement's reference names the stock
    we decided on and a fresh token, so two concurrent top-ups cannot both add the
    difference (the second one waits, then sees enough).
    """
    with transaction.atomic(savepoint=False):
        product = Product.objects.select_for_update().get(pk=product_id)
        missing = at_least - product.stock
        if missing <= 0:
            return None
        reference = f"top-up:{product.pk}:{product.stock}->{at_least}:{uuid4().hex}"
        stock_move(
            product_id=product.pk,
            quantity=missing,
            reference=reference,
            kind=StockMovement.Kind.RECEIPT,
            note=f"Top-up to {at_least}",
        )
    return StockMovement.objects.get(reference=reference)


def stock_adjust(
    *, product_id: int, quantity: int, reference: str, note: str = ""
) -> bool:
    """Add (or, negative, remove) `quantity` units by hand, once per `reference`
    (the admin's form carries a one-time token as the reference, so a second click
    moves nothing); False if that reference was already used. Removing more than
    there is raises `OutOfStock`."""
    return stock_move(
        product_id=product_id,
        quantity=quantity,
        reference=f"adjust:{reference}",
        kind=StockMovement.Kind.ADJUSTMENT,
        note=note,
    )
