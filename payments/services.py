"""Every change to payments.

Like the ledger's services these open plain `transaction.atomic()` blocks: the
idempotency engine wraps them in the transaction that also stores its response.
"""

from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger.models import JournalEntry
from ledger.services import (
    external_account,
    ledger_transfer,
    merchant_account,
    wallet_get_or_create,
)
from orders.models import Order
from orders.services import order_mark_paid, order_mark_refunded

from .exceptions import (
    AlreadyRefunded,
    OrderAlreadyPaid,
    OrderNotPayable,
    PaymentMethodUnavailable,
    PaymentNotRefundable,
)
from .models import Payment, Refund

PAID_STATES = (
    Order.Status.PAID,
    Order.Status.SHIPPED,
    Order.Status.COMPLETED,
    Order.Status.REFUNDED,
)


def payment_reference(order: Order) -> str:
    """The ledger reference of an order's balance payment: one debit per order."""
    return f"payment:{order.pk}"


def payment_pay_with_balance(*, order_id: int) -> Payment:
    """Debit the owner's wallet, credit the merchant and mark the order paid, once.

    One transaction: lock the order row, refuse if it is paid or cancelled, record the
    payment, move the money through the ledger (whose unique reference `payment:<order>`
    stops a second debit even if every check above were bypassed), mark the payment
    succeeded (a partial unique index allows one success per order) and move the order
    to `paid` with `WHERE status < paid`. Not enough money raises `InsufficientFunds`
    and the whole transaction, payment row included, rolls back.
    """
    with transaction.atomic():
        order = Order.objects.select_for_update().get(pk=order_id)
        if order.status in PAID_STATES:
            raise OrderAlreadyPaid()
        if order.status == Order.Status.CANCELLED:
            raise OrderNotPayable()
        wallet = wallet_get_or_create(user=order.owner, currency=order.currency)
        merchant = merchant_account(currency=order.currency)
        payment = Payment.objects.create(
            order=order,
            method=Payment.Method.BALANCE,
            amount=order.amount,
            currency=order.currency,
        )
        entry = ledger_transfer(
            source_id=wallet.pk,
            destination_id=merchant.pk,
            amount=order.amount,
            currency=order.currency,
            reference=payment_reference(order),
            kind=JournalEntry.Kind.PAYMENT,
            description=f"Order {order.merchant_order_no}",
        )
        payment.succeed()
        payment.journal_entry = entry
        payment.succeeded_at = timezone.now()
        payment.save(
            update_fields=["status", "journal_entry", "succeeded_at", "updated_at"]
        )
        if not order_mark_paid(order_id=order.pk):  # pragma: no cover - row is locked
            raise OrderAlreadyPaid()
    return payment


def payment_create(*, order_id: int, method: str) -> Payment:
    """Pay an order with `method`."""
    if method == Payment.Method.BALANCE:
        return payment_pay_with_balance(order_id=order_id)
    # `provider` (a pending payment with a pay_url, settled by the provider's signed
    # callback) belongs to the payment-provider issue; until it lands the method is
    # refused with a clear 422 rather than half-implemented.
    raise PaymentMethodUnavailable(
        f"Payment method {method!r} is not available yet; pay with balance."
    )


def refund_reference(payment: Payment) -> str:
    """The ledger reference of a payment's refund: one reversing entry per payment."""
    return f"refund:{payment.pk}"


def payment_refund(*, payment_id: int, reason: str = "requested") -> Refund:
    """Give a succeeded payment's money back, once, and move it and its order on.

    One transaction: lock the order, then the payment (the order-first lock order
    every payment service uses), refuse a refunded or unsettled payment, move the money
    back with a reversing entry (merchant -> the wallet it came from, or -> the
    outside world for a provider payment; its unique reference `refund:<payment>`
    stops a second movement), record the `Refund` (unique per payment), mark the
    payment refunded and the order refunded if it was paid (a cancelled order whose
    late success is refunded stays cancelled).
    """
    with transaction.atomic():
        order_id = Payment.objects.values_list("order_id", flat=True).get(pk=payment_id)
        order = Order.objects.select_for_update().get(pk=order_id)
        payment = Payment.objects.select_for_update().get(pk=payment_id)
        if payment.status == Payment.Status.REFUNDED:
            raise AlreadyRefunded()
        if payment.status != Payment.Status.SUCCEEDED:
            raise PaymentNotRefundable(
                f"Payment {payment.pk} is {payment.status}; only a succeeded payment "
                "can be refunded."
            )
        merchant = merchant_account(currency=payment.currency)
        if payment.method == Payment.Method.BALANCE:
            destination = wallet_get_or_create(
                user=order.owner, currency=payment.currency
            )
        else:
            destination = external_account(currency=payment.currency)
        entry = ledger_transfer(
            source_id=merchant.pk,
            destination_id=destination.pk,
            amount=payment.amount,
            currency=payment.currency,
            reference=refund_reference(payment),
            kind=JournalEntry.Kind.REFUND,
            description=f"Refund of order {order.merchant_order_no}",
        )
        try:
            with transaction.atomic():
                refund = Refund.objects.create(
                    payment=payment,
                    amount=payment.amount,
                    currency=payment.currency,
                    reason=reason,
                    journal_entry=entry,
                )
        except IntegrityError:  # pragma: no cover - the payment row is locked
            raise AlreadyRefunded() from None
        payment.refund()
        payment.save(update_fields=["status", "updated_at"])
        order_mark_refunded(order_id=order.pk)
    return refund
