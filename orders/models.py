"""Orders and the pre-order step that issues their merchant order numbers.

A client first asks for a pre-order: a fresh merchant order number (a Snowflake id)
recorded with the caller it was issued to and when it expires. Creating the order then
names that number. The number is the order's natural idempotency key: the web form
carries it as a one-time token, and the unique constraint on (owner, merchant_order_no)
turns any second submission into "here is the order you already placed".
"""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _
from django_fsm import ConcurrentTransitionMixin, FSMIntegerField, transition

from idempotency.sql import DatabaseNow
from ledger.fsm import ProtectedStateMixin

MERCHANT_ORDER_NO_MAX_LENGTH = 32


class PreOrderQuerySet(models.QuerySet["PreOrder"]):
    def judged(self) -> "PreOrderQuerySet":
        """Each pre-order with `expired` set by the database's clock, the one its
        expiry was set by and the purge reads (see `preorder_create`)."""
        return self.annotate(expired=Q(expires_at__lte=DatabaseNow()))


class PreOrder(models.Model):
    merchant_order_no = models.CharField(
        _("merchant order number"), max_length=MERCHANT_ORDER_NO_MAX_LENGTH, unique=True
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("owner"),
        on_delete=models.CASCADE,
        related_name="preorders",
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    expires_at = models.DateTimeField(_("expires"), db_index=True)

    objects = PreOrderQuerySet.as_manager()
    expired: bool  # (where read through `PreOrderQuerySet.judged`)

    class Meta:
        verbose_name = _("pre-order")
        verbose_name_plural = _("pre-orders")

    def __str__(self) -> str:
        return self.merchant_order_no


class OrderStatus(models.IntegerChoices):
    PENDING_PAYMENT = 10, _("Pending payment")
    # Its payment holds the money on the wallet until it is captured (-> paid),
    # voided or expires (-> cancelled).
    AUTHORIZED = 15, _("Authorized")
    PAID = 20, _("Paid")
    SHIPPED = 30, _("Shipped")
    COMPLETED = 40, _("Completed")
    CANCELLED = 90, _("Cancelled")
    REFUNDED = 95, _("Refunded")


# The state machine's sets of states, named once (the transitions below and the
# services' conditional updates both use them).
PAYABLE_STATES = [OrderStatus.PENDING_PAYMENT]
PAID_STATES = [
    OrderStatus.PAID,
    OrderStatus.SHIPPED,
    OrderStatus.COMPLETED,
    OrderStatus.REFUNDED,
]
REFUNDABLE_STATES = [OrderStatus.PAID, OrderStatus.SHIPPED, OrderStatus.COMPLETED]
CANCELLABLE_STATES = [OrderStatus.PENDING_PAYMENT, OrderStatus.AUTHORIZED]


class Order(ProtectedStateMixin, ConcurrentTransitionMixin, models.Model):
    """An order moves only forward through its integer states.

    The transitions below only declare the legal edges; `orders.services` saves them,
    and `ConcurrentTransitionMixin` makes that save an `UPDATE ... WHERE status =
    <the status we read>`, so two concurrent transitions cannot both win.
    """

    Status = OrderStatus

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("owner"),
        on_delete=models.PROTECT,
        related_name="orders",
    )
    merchant_order_no = models.CharField(
        _("merchant order number"), max_length=MERCHANT_ORDER_NO_MAX_LENGTH
    )
    amount = models.BigIntegerField(_("amount"))  # minor units
    currency = models.CharField(_("currency"), max_length=3)
    description = models.CharField(_("description"), max_length=255, blank=True)
    status = FSMIntegerField(
        _("status"),
        choices=Status.choices,
        default=Status.PENDING_PAYMENT,
        protected=True,
        db_index=True,
    )
    # By the database's clock, as the expiry of unpaid orders reads it.
    created_at = models.DateTimeField(_("created"), db_default=Now())
    updated_at = models.DateTimeField(_("updated"), auto_now=True)
    paid_at = models.DateTimeField(_("paid"), null=True, blank=True)

    class Meta:
        verbose_name = _("order")
        verbose_name_plural = _("orders")
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "merchant_order_no"],
                name="order_unique_owner_merchant_order_no",
            ),
            models.CheckConstraint(
                condition=Q(amount__gt=0), name="order_amount_positive"
            ),
        ]

    def __str__(self) -> str:
        return self.merchant_order_no

    @property
    def status_name(self) -> str:
        """The status as the API spells it: `pending_payment`, `paid`, ..."""
        return self.Status(self.status).name.lower()

    @property
    def is_paid(self) -> bool:
        """Money was taken for it (whatever happened after: shipped, refunded...)."""
        return self.status in PAID_STATES

    # Transitions only declare the legal edges; services save them. No I/O here.
    @transition(field=status, source=PAYABLE_STATES, target=Status.PAID)
    def pay(self) -> None:
        pass

    @transition(field=status, source=Status.PENDING_PAYMENT, target=Status.AUTHORIZED)
    def authorize(self) -> None:
        pass

    @transition(field=status, source=Status.AUTHORIZED, target=Status.PAID)
    def capture(self) -> None:
        pass

    @transition(field=status, source=Status.PAID, target=Status.SHIPPED)
    def ship(self) -> None:
        pass

    @transition(field=status, source=Status.SHIPPED, target=Status.COMPLETED)
    def complete(self) -> None:
        pass

    # An authorized order's hold is voided first (`orders.services.order_cancel`).
    @transition(field=status, source=CANCELLABLE_STATES, target=Status.CANCELLED)
    def cancel(self) -> None:
        pass

    @transition(field=status, source=REFUNDABLE_STATES, target=Status.REFUNDED)
    def refund(self) -> None:
        pass


SKU_MAX_LENGTH = 64


class Product(models.Model):
    """Something the shop sells, with how many units are left.

    `stock` is a running total of the product's stock movements (like an account's
    balance of its postings): it changes only through `orders.services.stock_move`,
    which records the movement first and then moves `stock` with one conditional
    `UPDATE`. The database refuses a negative stock whatever code runs.
    """

    sku = models.CharField(_("SKU"), max_length=SKU_MAX_LENGTH, unique=True)
    name = models.CharField(_("name"), max_length=255)
    price = models.BigIntegerField(_("price"))  # minor units
    currency = models.CharField(_("currency"), max_length=3)
    stock = models.BigIntegerField(_("stock"), default=0)
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    class Meta:
        verbose_name = _("product")
        verbose_name_plural = _("products")
        ordering = ["sku"]
        constraints = [
            models.CheckConstraint(
                condition=Q(stock__gte=0), name="product_stock_not_negative"
            ),
            models.CheckConstraint(
                condition=Q(price__gt=0), name="product_price_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.sku} {self.name}"


class StockMovement(models.Model):
    """One change of a product's stock: the journal of goods, append-only.

    The unique `reference` names the change (`order:<id>:take:<product id>`, ...): a
    change replayed, retried or raced inserts nothing the second time, and then moves
    no stock.
    """

    class Kind(models.TextChoices):
        RECEIPT = "receipt", _("Receipt")
        ADJUSTMENT = "adjustment", _("Adjustment")
        ORDER = "order", _("Taken by an order")
        RETURN = "return", _("Given back by a cancelled order")

    product = models.ForeignKey(
        Product,
        verbose_name=_("product"),
        on_delete=models.PROTECT,
        related_name="movements",
    )
    quantity = models.BigIntegerField(_("quantity"))  # signed: + in, - out
    reference = models.CharField(_("reference"), max_length=255, unique=True)
    kind = models.CharField(_("kind"), max_length=16, choices=Kind.choices)
    note = models.CharField(_("note"), max_length=255, blank=True)
    created_at = models.DateTimeField(_("created"), auto_now_add=True)

    class Meta:
        verbose_name = _("stock movement")
        verbose_name_plural = _("stock movements")
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(
                condition=~Q(quantity=0), name="stockmovement_quantity_not_zero"
            ),
        ]

    def __str__(self) -> str:
        return self.reference


class OrderItem(models.Model):
    """One line of an order placed with `items`: the product, how many, and the
    price it was sold at (a later price change does not rewrite the order)."""

    order = models.ForeignKey(
        Order,
        verbose_name=_("order"),
        on_delete=models.PROTECT,
        related_name="items",
    )
    product = models.ForeignKey(
        Product,
        verbose_name=_("product"),
        on_delete=models.PROTECT,
        related_name="order_items",
    )
    sku = models.CharField(_("SKU"), max_length=SKU_MAX_LENGTH)
    name = models.CharField(_("name"), max_length=255)
    quantity = models.BigIntegerField(_("quantity"))
    price = models.BigIntegerField(_("unit price"))  # minor units

    class Meta:
        verbose_name = _("order item")
        verbose_name_plural = _("order items")
        ordering = ["order", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["order", "product"], name="orderitem_unique_order_product"
            ),
            models.CheckConstraint(
                condition=Q(quantity__gt=0), name="orderitem_quantity_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.quantity} x {self.sku}"

    @property
    def amount(self) -> int:
        return self.price * self.quantity
