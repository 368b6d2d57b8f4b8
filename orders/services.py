"""Every change to orders and pre-orders.

These services open plain `transaction.atomic()` blocks, never durable ones: the
idempotency engine runs them inside the transaction that also stores the response, so
the order and "this key is done" commit together.
"""

from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone
from django_fsm import ConcurrentTransition, can_proceed

from idempotency.snowflake import next_snowflake
from idempotency.sql import delete_in_batches, insert_unless_exists
from ledger.currencies import currency_supported
from ledger.exceptions import DomainError

from .exceptions import (
    DuplicateOrder,
    MerchantOrderNoUnknown,
    OrderAlreadyPaid,
    OrderNotCancellable,
    OrderNotPayable,
    OrderTransitionNotAllowed,
)
from .models import PAYABLE_STATES, REFUNDABLE_STATES, Order, PreOrder

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


def preorder_create(*, owner: User) -> PreOrder:
    """Issue a fresh merchant order number to `owner`, usable until it expires.

    The number is a Snowflake id: unique without asking the database, roughly ordered
    by time. The row records who may use it and until when.
    """
    return PreOrder.objects.create(
        merchant_order_no=str(next_snowflake()),
        owner=owner,
        expires_at=timezone.now() + timedelta(seconds=settings.PREORDER_TTL_SECONDS),
    )


def order_create(
    *,
    owner: User,
    merchant_order_no: str,
    amount: int,
    currency: str,
    description: str = "",
) -> Order:
    """Create the order for a number a pre-order issued to `owner`, at most once.

    A number this caller was never issued, or one that expired unused, is refused. A
    second order for the same number is refused with `DuplicateOrder`, which names the
    existing order. The unique constraint on (owner, merchant_order_no) decides, in one
    `INSERT ... ON CONFLICT DO NOTHING`: a retry, a double click and two racing
    requests all lose the same way, without a savepoint or an exception.
    """
    if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
        raise ValueError("an order amount is a positive integer of minor units")
    if not currency_supported(currency):
        raise ValueError(f"the ledger does not hold {currency!r}")
    preorder = PreOrder.objects.filter(
        merchant_order_no=merchant_order_no, owner=owner
    ).first()
    if preorder is None:
        raise MerchantOrderNoUnknown()
    if preorder.is_expired:
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
    if not insert_unless_exists(order, ("owner_id", "merchant_order_no")):
        raise DuplicateOrder(merchant_order_no=merchant_order_no)
    return order


def _order_transition(
    order_id: int,
    name: str,
    refusal: type[DomainError] = OrderTransitionNotAllowed,
    before: Callable[[Order], None] | None = None,
) -> Order:
    """Lock the order, take the declared edge `name` (after `before(order)`), save.

    The row lock serialises transitions of one order; the save is also conditional on
    the status we read (ConcurrentTransitionMixin), the guard for any caller that did
    not lock.
    """
    with transaction.atomic(savepoint=False):
        order = Order.objects.select_for_update().get(pk=order_id)
        move = getattr(order, name)
        if not can_proceed(move):
            raise refusal(
                f"Order {order.merchant_order_no} is {order.status_name}; "
                f"it cannot {name}."
            )
        if before is not None:
            before(order)
        move()
        try:
            order.save(update_fields=["status", "updated_at"])
        except ConcurrentTransition:
            raise refusal(
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
    money held.
    """
    return _order_transition(order_id, "cancel", OrderNotCancellable, _release)


def _release(order: Order) -> None:
    if order.status == Order.Status.AUTHORIZED:
        for release in _releasers:
            release(order.pk)


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
    if not order_takes_payment(order):
        if order.is_paid:
            raise OrderAlreadyPaid()
        if order.status == Order.Status.AUTHORIZED:
            raise OrderNotPayable(
                f"Order {order.merchant_order_no} is authorized: capture or void its "
                "payment."
            )
        raise OrderNotPayable()
    return order


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
    """Cancel orders still unpaid `older_than_seconds` after they were placed.

    Batches of conditional `UPDATE ... WHERE status = pending_payment`: an order
    paid or authorized meanwhile is never touched. An authorized order expires with
    its hold instead (the payments app's hold expiry voids the hold, then cancels the
    order through `order_cancel`), so this never cancels an order that still holds
    money. A provider success arriving after this is refunded by the payments app.
    Returns how many were cancelled.
    """
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    cancelled = 0
    while True:
        ids = list(
            Order.objects.filter(
                status=Order.Status.PENDING_PAYMENT, created_at__lt=cutoff
            )
            .order_by("pk")
            .values_list("pk", flat=True)[:batch]
        )
        if not ids:
            return cancelled
        cancelled += Order.objects.filter(
            pk__in=ids, status=Order.Status.PENDING_PAYMENT
        ).update(status=Order.Status.CANCELLED, updated_at=timezone.now())


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
    cutoff = timezone.now() - timedelta(seconds=grace_seconds)
    # By owner and number: the orders' unique index answers each probe.
    used = Order.objects.filter(
        owner=OuterRef("owner"), merchant_order_no=OuterRef("merchant_order_no")
    )
    unused = PreOrder.objects.filter(expires_at__lt=cutoff).exclude(Exists(used))
    return delete_in_batches(unused, batch_size=batch_size, max_seconds=max_seconds)
