"""Every change to payments.

Each service runs in its caller's transaction (`atomic(savepoint=False)`): under the
pay API that is the idempotency engine's, which also stores the response, so a
refusal rolls back the whole request. Entry points that own a transaction (tasks,
commands, web views) open it `durable=True`. Tasks are sent by name after commit
(`enqueue_on_commit`): this module never imports `tasks`, which imports it.
"""

import logging
import unicodedata
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, InterfaceError, OperationalError, transaction
from django.db.models import Case, F, Q, QuerySet, When
from django.db.models.functions import Now
from django.utils import timezone

from idempotency.engine import Phases
from idempotency.sql import DatabaseNow, insert_unless_exists
from ledger.exceptions import AccountNotActive, HoldNotActive
from ledger.models import JournalEntry, Posting
from ledger.publishing import publish_within
from ledger.services import (
    external_provider_account,
    hold_authorize,
    hold_capture,
    hold_expire,
    hold_void,
    ledger_transfer,
    merchant_credit_account,
    merchant_give_back,
    wallet_get_or_create,
)
from ledger.texts import entry_params
from orders.exceptions import OrderAlreadyPaid
from orders.models import Order
from orders.services import (
    order_cancel,
    order_check_payable,
    order_lock_for_payment,
    order_mark_authorized,
    order_mark_captured,
    order_mark_paid,
    order_mark_refunded,
    order_takes_payment,
)

from .exceptions import (
    AlreadyRefunded,
    CallbackEventReused,
    CallbackMismatch,
    CaptureExceedsAuthorization,
    PaymentNotCapturable,
    PaymentNotRefundable,
    PaymentNotVoidable,
    ProviderChargeUsed,
    ProviderRefused,
    RefundReasonReserved,
)
from .models import ChargeTakenUp, Payment, ProviderEvent, Refund, Shipment
from .provider_client import (
    ProviderCharge,
    provider_charge_cancel,
    provider_charge_create,
    provider_charge_get,
    provider_charge_refund,
)

logger = logging.getLogger(__name__)


def enqueue_on_commit(task: str, *args: Any) -> None:
    """Send the task named `task` once the transaction commits, waiting on the broker
    a fraction of a second at most (`ledger.publishing`); a broker that is down or
    does not answer is logged, not raised: the row is durable, and beat's re-drive
    sends it again."""
    transaction.on_commit(lambda: publish_within(task, args))


CANCEL_OPEN_CHARGES = "payments.tasks.payment_cancel_open_charges_task"
PROCESS_EVENT = "payments.tasks.provider_event_process_task"
DISPATCH_SHIPMENT = "payments.tasks.shipment_dispatch_task"
RETURN_AT_PROVIDER = "payments.tasks.refund_return_at_provider_task"


def payment_reference(order: Order) -> str:
    """The ledger reference of an order's balance payment: one debit per order."""
    return f"payment:{order.pk}"


def _succeeded(payment: Payment, entry: JournalEntry) -> None:
    """Take the `succeed` edge and note the ledger entry that moved the money; the
    caller saves (with whatever else it changed)."""
    payment.succeed()
    payment.journal_entry = entry
    payment.succeeded_at = timezone.now()


def payment_pay_with_balance(*, order_id: int) -> Payment:
    """Debit the owner's wallet, credit the merchant and mark the order paid, once.

    One transaction: lock the order row, refuse if it is paid or cancelled, record the
    payment, move the money through the ledger (whose unique reference `payment:<order>`
    stops a second debit even if every check above were bypassed), mark the payment
    succeeded (a partial unique index allows one success per order), take the
    order's `pay` edge and create its one shipment. Not enough money raises
    `InsufficientFunds` and the whole transaction, payment row included, rolls back.
    If the order also has a pending provider payment, its charge is cancelled at the
    provider by a task sent after commit (`payment_cancel_open_charges`), so the
    shopper cannot pay twice.
    """
    with transaction.atomic(savepoint=False):
        order = order_lock_for_payment(order_id=order_id)
        wallet = wallet_get_or_create(owner_id=order.owner_id, currency=order.currency)
        reference = payment_reference(order)
        merchant = merchant_credit_account(currency=order.currency, spread_by=reference)
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
            reference=reference,
            kind=JournalEntry.Kind.PAYMENT,
            params=entry_params("order_payment", order=order.merchant_order_no),
        )
        _succeeded(payment, entry)
        payment.save(
            update_fields=["status", "journal_entry", "succeeded_at", "updated_at"]
        )
        if not order_mark_paid(order_id=order.pk):  # pragma: no cover - row is locked
            raise OrderAlreadyPaid()
        shipment_create(order_id=order.pk)
        payment_cancel_open_charges_later([order.pk])
    return payment


# How long a hold may last: a minute to thirty days (the API's `hold_seconds`, and
# HOLD_TTL_SECONDS, checked at start-up).
HOLD_SECONDS_MIN = 60
HOLD_SECONDS_MAX = 30 * 86400


def hold_reference(order: Order) -> str:
    """The reference of an order's hold: one authorization per order."""
    return f"hold:{order.pk}"


def payment_authorize_with_balance(*, order_id: int, hold_seconds: int) -> Payment:
    """Hold the order's amount on the owner's wallet for `hold_seconds` and mark
    the payment `authorized` and the order `authorized`, once.

    One transaction under the order's row lock: refuse an order that cannot take a
    payment, raise the wallet's `held` by one conditional UPDATE (`balance - held >=
    :amt`; not enough available raises `InsufficientFunds` and everything rolls
    back), record the payment with its hold, move the order `pending_payment ->
    authorized`. The balance does not move until the capture. A pending provider
    charge of the order is cancelled after commit, as for a wallet payment.
    """
    with transaction.atomic(savepoint=False):
        order = order_lock_for_payment(order_id=order_id)
        wallet = wallet_get_or_create(owner_id=order.owner_id, currency=order.currency)
        hold = hold_authorize(
            account_id=wallet.pk,
            amount=order.amount,
            reference=hold_reference(order),
            expires_in=timedelta(seconds=hold_seconds),
        )
        payment = Payment.objects.create(
            order=order,
            method=Payment.Method.BALANCE,
            amount=order.amount,
            currency=order.currency,
            status=Payment.Status.AUTHORIZED,
            authorized_amount=order.amount,
            hold=hold,
        )
        if not order_mark_authorized(order_id=order.pk):  # pragma: no cover - locked
            raise OrderAlreadyPaid()
        payment_cancel_open_charges_later([order.pk])
    return payment


def payment_capture(*, payment_id: int, amount: int | None = None) -> Payment:
    """Capture an authorized payment: debit `amount` (default: all that was
    authorized) from the wallet to the merchant, release the whole hold, mark the
    payment succeeded and the order paid, once.

    One transaction under the order and payment locks. Not authorized (captured,
    voided, expired) or its hold past `expires_at`: `PaymentNotCapturable`. More
    than authorized: `CaptureExceedsAuthorization`. The hold's conditional update
    (`WHERE status = 'active'`) decides a race with a void or the expiry, and the
    debit's unique reference `payment:<order>` stops a second debit.
    """
    with transaction.atomic(savepoint=False):
        order, payment = _lock(payment_id)
        if payment.status != Payment.Status.AUTHORIZED or payment.hold_id is None:
            raise PaymentNotCapturable(
                f"Payment {payment.pk} is {payment.status}; only an authorized "
                "payment can be captured."
            )
        authorized = payment.authorized_amount or 0
        amount = authorized if amount is None else amount
        if amount > authorized:
            raise CaptureExceedsAuthorization(
                f"Payment {payment.pk} authorized {authorized}; a capture of {amount} "
                "exceeds it.",
                authorized_amount=authorized,
            )
        if amount <= 0:
            raise ValueError("a capture moves a positive amount")
        reference = payment_reference(order)
        merchant = merchant_credit_account(
            currency=payment.currency, spread_by=reference
        )
        try:
            entry = hold_capture(
                hold_id=payment.hold_id,
                amount=amount,
                destination_id=merchant.pk,
                currency=payment.currency,
                reference=reference,
                kind=JournalEntry.Kind.PAYMENT,
                description=f"Order {order.merchant_order_no}",
            )
        except HoldNotActive:
            raise PaymentNotCapturable(
                f"Payment {payment.pk}'s authorization expired; it can no longer be "
                "captured."
            ) from None
        payment.capture()
        payment.amount = amount
        payment.journal_entry = entry
        payment.succeeded_at = timezone.now()
        payment.save(
            update_fields=[
                "status",
                "amount",
                "journal_entry",
                "succeeded_at",
                "updated_at",
            ]
        )
        if not order_mark_captured(order_id=order.pk):  # pragma: no cover - locked
            raise OrderAlreadyPaid()
        shipment_create(order_id=order.pk)
        # The locked row, moved in memory along the edge its row just took, serves
        # the answer: no second read of the order.
        order.capture()
        payment.order = order
    return payment


def _void_locked(payment: Payment) -> None:
    """Release an authorized payment's hold and mark it voided; the caller holds
    the order's and the payment's row locks."""
    if payment.hold_id is not None:
        hold_void(hold_id=payment.hold_id)
    payment.void()
    payment.save(update_fields=["status", "updated_at"])


def payment_void(*, payment_id: int) -> Payment:
    """Void an authorized payment: release its hold, mark it voided and cancel its
    order, once.

    One transaction under the order and payment locks; not authorized:
    `PaymentNotVoidable`. The order is cancelled through `order_cancel`, so
    whatever else a cancellation gives back happens too.
    """
    with transaction.atomic(savepoint=False):
        order, payment = _lock(payment_id)
        if payment.status != Payment.Status.AUTHORIZED:
            raise PaymentNotVoidable(
                f"Payment {payment.pk} is {payment.status}; only an authorized "
                "payment can be voided."
            )
        _void_locked(payment)
        order_cancel(order_id=order.pk)
    return payment


def payment_void_for_order(order_id: int) -> None:
    """Void the authorized payments of an order being cancelled (registered with
    `order_cancel` by `PaymentsConfig.ready()`; it holds the order's row lock)."""
    authorized = Payment.objects.select_for_update().filter(
        order_id=order_id, status=Payment.Status.AUTHORIZED
    )
    for payment in authorized.order_by("pk"):
        _void_locked(payment)


def payment_expire(*, payment_id: int) -> tuple[Payment, bool]:
    """Expire an authorized payment whose hold is past `expires_at`: release the
    hold, mark the payment expired and cancel its order; anything else stays.
    Returns (payment, whether this call expired it).

    One transaction under the order and payment locks; the hold's conditional
    update (`WHERE status = 'active' AND expires_at <= now`) decides a race with a
    capture or a void, so a second run (two beats at once) changes nothing.
    """
    with transaction.atomic(savepoint=False):
        order, payment = _lock(payment_id)
        if payment.status != Payment.Status.AUTHORIZED or payment.hold_id is None:
            return payment, False
        try:
            hold_expire(hold_id=payment.hold_id)
        except HoldNotActive:
            return payment, False  # not past its expiry yet
        payment.expire()
        payment.save(update_fields=["status", "updated_at"])
        order_cancel(order_id=order.pk)
    return payment, True


def payments_hold_expired(*, limit: int = 500) -> list[int]:
    """Ids of authorized payments whose hold is past `expires_at` by the database's
    clock (as `hold_expire` decides), oldest first."""
    return list(
        Payment.objects.filter(
            status=Payment.Status.AUTHORIZED,
            hold__status="active",
            hold__expires_at__lte=DatabaseNow(),
        )
        .order_by("hold__expires_at", "pk")
        .values_list("pk", flat=True)[:limit]
    )


def _pending_provider_payments(*order_ids: int) -> QuerySet[Payment]:
    return Payment.objects.filter(
        order_id__in=order_ids,
        method=Payment.Method.PROVIDER,
        status=Payment.Status.PENDING,
    )


def payment_cancel_open_charges_later(order_ids: list[int]) -> None:
    """Run when orders were cancelled (`orders.services.order_cancel_listener`): a
    provider payment still open is cancelled at the provider once the cancel
    commits, so the payer can no longer pay a cancelled order on the pay page
    (the money would come, and go back as a refund). Whoever cancelled it: the
    caller, staff, or the expiry of an unpaid order or of its hold; and when an
    order was paid, or authorized, from the wallet. One query for however many
    orders a batch of the expiry cancelled."""
    open_ = _pending_provider_payments(*order_ids).values_list("order_id", flat=True)
    for order_id in sorted(set(open_)):
        enqueue_on_commit(CANCEL_OPEN_CHARGES, order_id)


def payment_pay_with_provider(
    *, order_id: int, phases: Phases, return_url: str = ""
) -> Payment:
    """Open the order's provider payment, have the provider open its charge, and
    record the charge's pay page: three steps, each committed with a recovery point.

    Under the pay API, `phases` are the engine's: a retry after a crash, or beat's
    completer, resumes after the last step that committed. A web view passes
    `Phases.unrecorded()`; a second click then continues the same payment, because
    every step is safe to repeat: the pending payment is reused, the provider dedupes
    by merchant order number, and a recorded transaction is never overwritten.
    The provider is called outside any transaction, holding no row lock.
    `return_url` (the shopper's order page) is where the provider's pay page sends
    the payer back; it is recorded with the first step, so a resumed request uses it.

    A request resumed after its order stopped taking money (paid another way or
    cancelled while the request stood between its steps) is refused as a fresh one
    would be (`OrderAlreadyPaid`, `OrderNotPayable`; the engine stores the refusal),
    never answered with a pay page that can no longer be paid: before the provider
    is asked, nothing is opened there; after it, the charge is cancelled (by the
    task the record sends, or the one that paid or cancelled the order). One whose
    payment beat's re-drive failed (the provider had no charge yet), before or
    while it asked the provider, answers the order's payment opened again, with
    the provider's one charge recorded on it, as a fresh request would: never a
    payment that failed.
    """
    if phases.recovery_point == "started":
        with phases.phase("payment_created"):
            payment = payment_provider_start(order_id=order_id)
            phases.data.update(
                payment_id=payment.pk, order_id=order_id, return_url=return_url
            )
    payment = Payment.objects.select_related("order").get(pk=phases.data["payment_id"])
    to_charge = phases.recovery_point == "payment_created" and not payment.pay_url
    if to_charge and _start_again(payment):
        # Closed or no longer payable since the first step committed: start again
        # as a fresh request, under the order's lock, before asking the provider.
        with phases.phase("payment_created"):
            payment = payment_provider_start(order_id=payment.order_id)
            phases.data["payment_id"] = payment.pk
    if phases.recovery_point == "payment_created" and not payment.pay_url:
        order = payment.order
        # The merchant order number is the provider's idempotency key: a resumed
        # request gets the same charge back instead of a second one.
        charge = provider_charge_create(
            merchant_order_no=order.merchant_order_no,
            amount=order.amount,
            currency=order.currency,
            description=order.description,
            return_url=phases.data.get("return_url", return_url),
        )
        with phases.phase("provider_answered"):
            payment = payment_record_charge(
                payment_id=payment.pk,
                provider_txn_id=charge.txn_id,
                pay_url=charge.pay_url,
            )
            # The order's payment opened again, if beat's re-drive failed this one
            # while the provider answered: the one a resumed request answers.
            phases.data["payment_id"] = payment.pk
    if payment.status in _UNPAID:
        # Its order, as read with the payment after the last step, may have been
        # paid another way or cancelled meanwhile: its pay page is no answer then.
        order_check_payable(payment.order)
    return payment


# A provider payment that took no money: open, or closed without it.
_UNPAID = (Payment.Status.PENDING, Payment.Status.CANCELLED, Payment.Status.FAILED)


def _start_again(payment: Payment) -> bool:
    """A resumed pay request's payment that took no money and can take none as it
    is: closed (cancelled, failed), or open for an order that no longer takes it."""
    if payment.status == Payment.Status.PENDING:
        return not order_takes_payment(payment.order)
    return payment.status in _UNPAID


def payment_provider_start(*, order_id: int) -> Payment:
    """Open the order's pending provider payment, or return the one it has.

    Under the order's row lock: refuse a paid or cancelled order; one pending
    provider payment per order (a second pay request, under another key, continues
    the first one instead of opening a second charge). An order whose charge the
    provider collected and we gave back (`provider_charge_used`) is refused before
    the provider is asked (`ProviderChargeUsed`).
    """
    with transaction.atomic(savepoint=False):
        order = order_lock_for_payment(order_id=order_id)
        pending = _pending_provider_payments(order.pk).first()
        if pending is not None:
            return pending
        if provider_charge_used(order_id=order.pk):
            raise ProviderChargeUsed()
        return Payment.objects.create(
            order=order,
            method=Payment.Method.PROVIDER,
            amount=order.amount,
            currency=order.currency,
        )


def provider_charge_used(*, order_id: int) -> bool:
    """Whether a provider payment of the order booked money: the provider keys its
    one charge by merchant order number, so while the order still takes money (a
    charge of another amount, given back by `payment_settle`) it has no charge left
    to open for it. The rule is `Payment.used_provider_charge`, over the order's
    few payments."""
    payments = Payment.objects.filter(order_id=order_id).only("method", "journal_entry")
    return any(payment.used_provider_charge for payment in payments)


def payment_record_charge(
    *, payment_id: int, provider_txn_id: str, pay_url: str
) -> Payment:
    """Record the provider's transaction and pay page on the payment (once: a
    recorded transaction is never overwritten); return the payment that has it.

    Under the order and payment locks, as the services that close a pending
    payment take them. The payment may have been closed while its pay request
    talked to the provider:
    - failed by beat's re-drive (the provider had no charge yet) while its order
      still takes money: the charge is the order's, and is recorded on the order's
      open payment, opened again if need be, as a fresh request would have it (the
      provider dedupes by merchant order number: a fresh request gets this charge);
    - cancelled (the order was paid another way, and the cancel found no charge
      yet), or failed for an order that no longer takes money: the charge just
      opened is cancelled too, by a task sent after commit. The payment's
      `charge_cancel` says `pending` until the provider confirms it, so that beat
      sends the task again if it is lost (a broker that did not take it).
    """
    with transaction.atomic(savepoint=False):
        order, payment = _lock(payment_id)
        if payment.provider_txn_id:
            return Payment.objects.select_related("order").get(pk=payment_id)
        if payment.status == Payment.Status.FAILED and order_takes_payment(order):
            reopened = payment_provider_start(order_id=order.pk)
            return payment_record_charge(
                payment_id=reopened.pk, provider_txn_id=provider_txn_id, pay_url=pay_url
            )
        # By the database's clock: a charge to cancel is pending since `updated_at`
        # (which nothing else moves until the cancel is confirmed), as beat's
        # re-drive reads it.
        record = {"provider_txn_id": provider_txn_id, "pay_url": pay_url}
        if payment.status in _CLOSED_UNPAID:
            record["charge_cancel"] = Payment.ChargeCancel.PENDING
            enqueue_on_commit(CANCEL_OPEN_CHARGES, payment.order_id)
        Payment.objects.filter(pk=payment.pk).update(**record, updated_at=Now())
    return Payment.objects.select_related("order").get(pk=payment_id)


# A provider payment closed without taking money: a charge recorded on it after it
# was closed is cancelled at the provider.
_CLOSED_UNPAID = (Payment.Status.CANCELLED, Payment.Status.FAILED)


def refund_reference(payment: Payment) -> str:
    """The ledger reference of a payment's refund: one reversing entry per payment."""
    return f"refund:{payment.pk}"


def _refund_locked(
    *,
    order: Order,
    payment: Payment,
    reason: str,
    credited_id: int | None = None,
    returned_at_provider: bool = False,
) -> Refund:
    """Move a succeeded payment's money back; the caller holds both row locks.

    `payment` may be succeeded only in memory (a late success being given back at
    once, `credited_id` the account that transaction just credited, whose row it
    holds: the money goes back from there): the save is conditional on the status
    the row had when it was read. Otherwise the money comes from wherever the
    payment's entry put it (`merchant_give_back`).
    """
    if payment.method == Payment.Method.BALANCE:
        destination_id = wallet_get_or_create(
            owner_id=order.owner_id, currency=payment.currency
        ).pk
    else:
        # Provider money goes back where it came from: out through the provider,
        # to the outside account its settlement debited (one of the outside's
        # sub-accounts, with MERCHANT_SUB_ACCOUNTS).
        destination_id = _settled_through(payment, debited=True)
    movement: dict[str, Any] = {
        "destination_id": destination_id,
        "amount": payment.amount,
        "currency": payment.currency,
        "reference": refund_reference(payment),
        "kind": JournalEntry.Kind.REFUND,
        "params": entry_params("order_refund", order=order.merchant_order_no),
    }
    if credited_id is not None:
        entry = ledger_transfer(source_id=credited_id, **movement)
    elif payment.journal_entry_id is not None:
        entry = merchant_give_back(entry_id=payment.journal_entry_id, **movement)
    else:  # pragma: no cover - a succeeded payment has its entry
        raise ValueError(f"payment {payment.pk} has no journal entry")
    provider = payment.method == Payment.Method.PROVIDER
    # Money the provider gave back already is not asked back from it again (a real
    # provider may refuse to refund a refunded charge).
    to_return = provider and not returned_at_provider
    at_provider: str
    if to_return:
        at_provider, returned_at = Refund.AtProvider.PENDING, None
    elif provider:
        at_provider, returned_at = Refund.AtProvider.RETURNED, Now()
    else:
        at_provider, returned_at = "", None
    try:
        with transaction.atomic():
            refund = Refund.objects.create(
                payment=payment,
                amount=payment.amount,
                currency=payment.currency,
                reason=reason,
                journal_entry=entry,
                at_provider=at_provider,
                returned_at=returned_at,
            )
    except IntegrityError:  # pragma: no cover - the payment row is locked
        raise AlreadyRefunded() from None
    payment.refund()
    payment.save()
    if to_return:
        enqueue_on_commit(RETURN_AT_PROVIDER, refund.pk)
    return refund


def refund_return_at_provider(*, refund_id: int) -> bool:
    """Have the provider give a provider payment's refunded money back to the payer,
    once; True if this call marked it returned.

    Never inside a transaction (the provider call), and safe to repeat: the provider
    refunds a charge once however often it is asked, and our mark is a conditional
    update of a pending refund. A task killed between the two is delivered again (or
    beat sends it again) and asks again. A provider that does not answer raises
    `ProviderUnavailable` (the task retries); one that refuses (the charge was never
    paid there) marks it `refused`: asking again would not change the answer, and
    `check_ledger` names it for an operator.
    """
    refund = Refund.objects.select_related("payment__order").get(pk=refund_id)
    if refund.at_provider != Refund.AtProvider.PENDING:
        return False
    pending = Refund.objects.filter(pk=refund_id, at_provider=Refund.AtProvider.PENDING)
    try:
        provider_charge_refund(merchant_order_no=refund.payment.order.merchant_order_no)
    except ProviderRefused as refused:
        logger.error("the provider refused refund %s: %s", refund_id, refused)
        pending.update(at_provider=Refund.AtProvider.REFUSED)
        return False
    return bool(
        pending.update(at_provider=Refund.AtProvider.RETURNED, returned_at=Now())
    )


def _lock(payment_id: int) -> tuple[Order, Payment]:
    """Lock a payment's order, then the payment: the order every service uses.

    The order is found through the payment in the same statement (`FOR UPDATE OF`
    the order only); the payment comes with its hold, if any, unlocked."""
    order = Order.objects.select_for_update(of=("self",)).get(payments__pk=payment_id)
    payment = (
        Payment.objects.select_for_update(of=("self",))
        .select_related("hold")
        .get(pk=payment_id)
    )
    return order, payment


# The refund reason of a charge the provider collected for another amount than
# we asked (`payment_settle`); `check_ledger` names these until given back.
AMOUNT_MISMATCH = "amount_mismatch"
# The refund reason of a payment whose charge the provider says it refunded.
REFUNDED_AT_PROVIDER = "refunded_at_provider"
# The refund reasons of a charge that settled for an order no longer taking money.
ORDER_ALREADY_PAID = "order_already_paid"
ORDER_AUTHORIZED = "order_authorized"
ORDER_CANCELLED = "order_cancelled"
# The reasons only the system gives, when the provider's answer forces a refund: a
# refund someone asks for (the API, the back office) never carries one, so the
# journal and the back office tell the two apart.
RESERVED_REFUND_REASONS = frozenset(
    {
        AMOUNT_MISMATCH,
        REFUNDED_AT_PROVIDER,
        ORDER_ALREADY_PAID,
        ORDER_AUTHORIZED,
        ORDER_CANCELLED,
    }
)


def refund_reason_is_reserved(reason: str) -> bool:
    """Whether `reason` is one only the system gives, whatever its case, its
    compatibility form (full-width letters), the whitespace around it and the
    invisible format characters in it (a zero-width space, a soft hyphen), which
    would show it as the system's own."""
    visible = "".join(c for c in reason if unicodedata.category(c) != "Cf")
    folded = unicodedata.normalize("NFKC", visible).strip().casefold()
    return folded in RESERVED_REFUND_REASONS


def payment_refund(*, payment_id: int, reason: str = "requested") -> Refund:
    """Refund a payment someone asked to refund (the API, the shop, the back
    office): `_payment_refund`, with `reason` theirs. A reason only the system
    gives raises `RefundReasonReserved` before anything is read or written."""
    if refund_reason_is_reserved(reason):
        detail = (
            f"The refund reason {reason.strip()!r} is reserved for refunds the "
            "system makes; give another."
        )
        raise RefundReasonReserved(detail, errors={"reason": [detail]})
    return _payment_refund(payment_id=payment_id, reason=reason)


def _payment_refund(
    *,
    payment_id: int,
    reason: str,
    returned_at_provider: bool = False,
    credited_id: int | None = None,
) -> Refund:
    """Give a succeeded payment's money back, once, and move it and its order on.

    One transaction: lock the order, then the payment (the order-first lock order
    every payment service uses), refuse a refunded or unsettled payment, move the money
    back with a reversing entry (merchant -> the wallet it came from, or -> the
    outside world for a provider payment; its unique reference `refund:<payment>`
    stops a second movement), record the `Refund` (unique per payment), mark the
    payment refunded and the order refunded (a conditional update), and cancel the
    order's shipment if it was not dispatched yet: nothing goes out for money that
    went back (the dispatch is a conditional update of a pending shipment, so the
    two find what the other did). `returned_at_provider`: the provider says it gave
    the money back already (a charge refunded there), so it is not asked to.
    `credited_id`: the payment was settled in the caller's transaction, which
    holds the row of the account it credited: the money goes back from there
    (`_refund_locked`).
    """
    with transaction.atomic(savepoint=False):
        order, payment = _lock(payment_id)
        if payment.status == Payment.Status.REFUNDED:
            raise AlreadyRefunded()
        if payment.status != Payment.Status.SUCCEEDED:
            raise PaymentNotRefundable(
                f"Payment {payment.pk} is {payment.status}; only a succeeded payment "
                "can be refunded."
            )
        refund = _refund_locked(
            order=order,
            payment=payment,
            reason=reason,
            credited_id=credited_id,
            returned_at_provider=returned_at_provider,
        )
        if order_mark_refunded(order_id=order.pk):
            Shipment.objects.filter(
                order_id=order.pk, status=Shipment.Status.PENDING
            ).update(status=Shipment.Status.CANCELLED)
    return refund


def _settled_through(payment: Payment, *, debited: bool) -> int:
    """The account a provider payment's settlement debited (one of the outside
    world's) or credited (one of the merchant's): its entry's one posting of that
    side."""
    side = {"amount__lt": 0} if debited else {"amount__gt": 0}
    postings = Posting.objects.filter(entry_id=payment.journal_entry_id, **side)
    return postings.values_list("account_id", flat=True).get()


def provider_reference(payment: Payment) -> str:
    """The ledger reference of a provider payment's settlement: once per payment."""
    return f"provider:{payment.pk}"


# A payment that booked its charge's money (kept, or given back).
_SETTLED = (Payment.Status.SUCCEEDED, Payment.Status.REFUNDED)


def payment_settle(
    *, payment_id: int, provider_txn_id: str, amount: int | None = None
) -> Payment:
    """Record that the provider collected a payment's money, once.

    One transaction under the order and payment locks. Settled already (a second
    event, a redelivered task, the re-drive): nothing happens. Otherwise the money
    comes in from outside (external -> merchant, reference `provider:<payment>`;
    both sides spread over sub-accounts with `MERCHANT_SUB_ACCOUNTS`),
    the payment succeeds and the order moves to `paid` only forward, with its one
    shipment. If the order can no longer take the money (cancelled meanwhile, or
    paid by another payment) the success is refunded in the same transaction: the
    payment ends `refunded` and the money goes back out.

    `amount` is what the provider says it collected (default: what we asked). Any
    other amount is not the order's payment: it is booked as it came in, the
    payment's `amount` becomes it, and it is refunded at once the same way (reason
    `amount_mismatch`), the order left as it was; `check_ledger` names it until the
    provider has given it back. A charge that another payment of the order has
    booked already (a pay request opened after it, which never got a charge of
    its own) is not this payment's money: a pending payment fails instead. An
    answer about a charge that is not this payment's at all (`_not_its_charge`)
    changes nothing: booked here, it would be money this payment never collected,
    or a charge booked twice.
    """
    with transaction.atomic(savepoint=False):
        order, payment = _lock(payment_id)
        if payment.status in _SETTLED or _not_its_charge(payment, provider_txn_id):
            return payment
        return _settle_its_charge(order, payment, provider_txn_id, amount)


def _settle_its_charge(
    order: Order, payment: Payment, provider_txn_id: str, amount: int | None
) -> Payment:
    """`payment_settle` for an answer about the payment's own charge: the caller
    holds the order's and payment's locks (`_lock`) and asked `_not_its_charge`
    under them, once (the callbacks' and the re-drive's answers go through here
    too, each checked once)."""
    if payment.status in _SETTLED:
        return payment
    if _charge_booked_by_another(payment, provider_txn_id):
        if payment.status == Payment.Status.PENDING:
            payment.fail()
            payment.save()
        return payment
    collected = payment.amount if amount is None else amount
    mismatch = collected != payment.amount
    if mismatch:
        logger.error(
            "the provider collected %s for payment %s of order %s, not %s: given back",
            collected,
            payment.pk,
            order.merchant_order_no,
            payment.amount,
        )
        payment.amount = collected
    reference = provider_reference(payment)
    merchant = merchant_credit_account(currency=payment.currency, spread_by=reference)
    entry = ledger_transfer(
        source_id=external_provider_account(
            currency=payment.currency, spread_by=reference
        ).pk,
        destination_id=merchant.pk,
        amount=payment.amount,
        currency=payment.currency,
        reference=reference,
        kind=JournalEntry.Kind.PAYMENT,
        params=entry_params("order_payment_provider", order=order.merchant_order_no),
    )
    _succeeded(payment, entry)
    if not payment.provider_txn_id:
        payment.provider_txn_id = provider_txn_id
    if mismatch or not order_takes_payment(order):
        reason = (
            AMOUNT_MISMATCH
            if mismatch
            else ORDER_ALREADY_PAID
            if order.is_paid
            else ORDER_AUTHORIZED
            if order.status == Order.Status.AUTHORIZED
            else ORDER_CANCELLED
        )
        _refund_locked(
            order=order, payment=payment, reason=reason, credited_id=merchant.pk
        )
        return payment
    payment.save()
    order_mark_paid(order_id=order.pk)
    shipment_create(order_id=order.pk)
    return payment


def _not_its_charge(payment: Payment, provider_txn_id: str) -> bool:
    """Whether the provider's answer names a charge that is not the payment's: the
    payment recorded another transaction (the charge the provider opened for it,
    never overwritten), or, none recorded yet, the transaction is one that a
    payment of another order recorded (the provider's transactions are its
    charges, one per merchant order number). An answer naming none is taken as
    about the payment's own. Such an answer changes nothing, whether it settles,
    fails or cancels (`payment_settle`, `_close_pending`, a callback's event):
    logged here, once for all of them. The caller holds the payment's lock."""
    if not provider_txn_id:
        return False
    if payment.provider_txn_id:
        other = payment.provider_txn_id != provider_txn_id
    else:
        other = (
            Payment.objects.filter(provider_txn_id=provider_txn_id)
            .exclude(order_id=payment.order_id)
            .exists()
        )
    if other:
        logger.warning(
            "the provider's answer about charge %s is not payment %s's (%s): "
            "nothing changes",
            provider_txn_id,
            payment.pk,
            payment.provider_txn_id or "none recorded",
        )
    return other


def _charge_booked_by_another(payment: Payment, provider_txn_id: str) -> bool:
    """Whether the provider transaction is one another payment of the order has
    booked already; the caller holds the order's lock, which every settlement
    takes first."""
    txn = payment.provider_txn_id or provider_txn_id
    return bool(txn) and (
        Payment.objects.filter(
            order_id=payment.order_id,
            provider_txn_id=txn,
            journal_entry__isnull=False,
        )
        .exclude(pk=payment.pk)
        .exists()
    )


# The provider's answers that say it collected the money (a refund there came after).
_COLLECTED = ("SUCCESS", "REFUNDED")


def payment_apply_charge(
    *,
    payment_id: int,
    charge: ProviderCharge | None,
    recorded_txn_id: str | None = None,
) -> Payment:
    """Bring a provider payment to what the provider says of its charge, once,
    through the services its callbacks use.

    No charge, or declined: the payment fails; cancelled: it is cancelled (both
    only from `pending`; given `recorded_txn_id`, the transaction the payment had
    when the provider was asked, only while it still has that one; and never by an
    answer about a charge that is not the payment's, `_not_its_charge`). Collected:
    settled as `payment_settle` settles, with the amount collected
    (another amount than asked is given back at once). Collected and then
    refunded at the provider: settled and refunded (reason
    `refunded_at_provider`), so the order ends `refunded` whether its success
    callback came first or not at all; the refund is recorded returned (the
    provider gave the money back; it is not asked again). Still open at the
    provider: nothing changes. A refund of another transaction than the one a
    settled payment booked is not its money coming back: nothing changes either, as
    a success of another transaction changes nothing on a settled payment. Runs in
    the caller's transaction; every step re-reads under the order's and payment's
    locks, so a callback, another re-drive or a repeat changes nothing more.
    """
    with transaction.atomic(savepoint=False):
        if charge is None:
            return payment_fail(payment_id=payment_id, recorded_txn_id=recorded_txn_id)
        if charge.status not in ("FAILED", "CANCELLED", *_COLLECTED):
            return Payment.objects.get(pk=payment_id)
        # Every step below runs under these locks (held to our commit), so a
        # success being settled meanwhile is decided on what it booked; the
        # charge is checked once, as a callback's is.
        order, payment = _lock(payment_id)
        if _not_its_charge(payment, charge.txn_id):
            _other_charge_heard(payment, charge)
            return payment
        if charge.status == "FAILED":
            return _close_its_charge(payment, "fail", recorded_txn_id)
        if charge.status == "CANCELLED":
            return _close_its_charge(payment, "cancel")
        settled_before = payment.journal_entry_id is not None
        if charge.status == "REFUNDED":
            booked = payment.provider_txn_id
            if payment.status == Payment.Status.SUCCEEDED and booked != charge.txn_id:
                logger.warning(
                    "the provider refunded charge %s, not payment %s's %s: "
                    "not refunded here",
                    charge.txn_id,
                    payment.pk,
                    booked or "(none recorded)",
                )
                return payment
        payment = _settle_its_charge(order, payment, charge.txn_id, charge.amount)
        if charge.status == "REFUNDED" and payment.status == Payment.Status.SUCCEEDED:
            logger.warning(
                "the provider refunded payment %s's charge %s: refunded here too",
                payment.pk,
                charge.txn_id,
            )
            # Settled just now: given back from the account the settlement
            # credited, whose row this transaction holds, as a late success is.
            # (`merchant_give_back` would lock the merchant's own row after its
            # sub-account's, which a sweep locks the other way round.)
            credited_id = (
                None if settled_before else _settled_through(payment, debited=False)
            )
            _payment_refund(
                payment_id=payment.pk,
                reason=REFUNDED_AT_PROVIDER,
                returned_at_provider=True,
                credited_id=credited_id,
            )
            payment = Payment.objects.get(pk=payment.pk)
    return payment


def _other_charge_heard(payment: Payment, charge: ProviderCharge) -> None:
    """Keep on the payment, whose row the caller holds locked, the provider's
    answer about a charge that is not its own: it changes nothing, and would
    otherwise leave a log line only (a callback's keeps its event). `/metrics`
    counts such payments, the admin filters them, and `check_ledger` names a
    collected charge that no payment booked: the provider may hold money the
    ledger never recorded. One conditional update: the same answer again writes
    nothing, and a collected charge stays named over a later answer that one was
    not collected."""
    heard = Payment.objects.filter(pk=payment.pk).exclude(
        other_charge_txn_id=charge.txn_id, other_charge_status=charge.status
    )
    if charge.status != "SUCCESS":  # only its own refund replaces a success
        heard = heard.exclude(
            Q(other_charge_status="SUCCESS") & ~Q(other_charge_txn_id=charge.txn_id)
        )
    if charge.status not in _COLLECTED:
        heard = heard.exclude(other_charge_status__in=_COLLECTED)
    if heard.update(
        other_charge_txn_id=charge.txn_id, other_charge_status=charge.status
    ):
        payment.other_charge_txn_id = charge.txn_id
        payment.other_charge_status = charge.status


def charge_take_up(*, provider_txn_id: str, user_id: int) -> bool:
    """Record that staff took the provider charge `provider_txn_id`, reported
    collected in an answer about another charge, up with the provider (refunded it
    there, settled it by hand): `check_ledger` stops naming it. Once: True if this
    call recorded it, False if it was recorded before, by a second press or a
    second staff member at the same instant (one INSERT ... ON CONFLICT DO NOTHING
    on the unique transaction id). Runs in the caller's transaction."""
    taken = ChargeTakenUp(provider_txn_id=provider_txn_id, taken_up_by_id=user_id)
    return insert_unless_exists(taken, ["provider_txn_id"])


def _close_pending(
    payment_id: int,
    edge: str,
    recorded_txn_id: str | None = None,
    provider_txn_id: str = "",
) -> Payment:
    """Take `edge` out of `pending` under the locks; anything else stays (the
    save is conditional on the status read: ConcurrentTransitionMixin). Given
    `recorded_txn_id`, only a payment whose provider transaction is still that one;
    given the answer's `provider_txn_id`, only a payment whose charge it is."""
    with transaction.atomic(savepoint=False):
        _, payment = _lock(payment_id)
        if payment.status == Payment.Status.PENDING and not _not_its_charge(
            payment, provider_txn_id
        ):
            _close_its_charge(payment, edge, recorded_txn_id)
    return payment


def _close_its_charge(
    payment: Payment, edge: str, recorded_txn_id: str | None = None
) -> Payment:
    """`_close_pending` for an answer about the payment's own charge: the caller
    holds the locks and asked `_not_its_charge` under them, once."""
    unchanged = recorded_txn_id in (None, payment.provider_txn_id)
    if payment.status == Payment.Status.PENDING and unchanged:
        getattr(payment, edge)()
        payment.save()
    return payment


def payment_fail(
    *, payment_id: int, recorded_txn_id: str | None = None, provider_txn_id: str = ""
) -> Payment:
    """Mark a pending payment failed (the provider said so); anything else stays.
    With `recorded_txn_id` (the transaction it had when the provider was asked),
    one that has recorded another since stays pending: the provider's answer was
    not about that charge. With `provider_txn_id` (the charge the provider says
    was declined), one whose charge it is not stays pending (`_not_its_charge`)."""
    return _close_pending(payment_id, "fail", recorded_txn_id, provider_txn_id)


def payment_cancel(
    *, payment_id: int, recorded_txn_id: str | None = None, provider_txn_id: str = ""
) -> Payment:
    """Mark a pending provider payment cancelled (its charge was cancelled at the
    provider, or never reached it); anything else stays. With `recorded_txn_id`
    (the transaction it had when the provider was asked), one that has recorded
    another since stays pending: that charge was not the one cancelled. With
    `provider_txn_id` (the charge the provider says it cancelled), one whose charge
    it is not stays pending (`_not_its_charge`)."""
    return _close_pending(payment_id, "cancel", recorded_txn_id, provider_txn_id)


def payment_cancel_open_charges(*, order_id: int) -> list[Payment]:
    """Cancel the open provider charge of an order that no longer takes money, and
    mark its pending provider payments cancelled; return the payments it closed.

    Sent after an order is paid another way, and used by the re-drive. Never inside
    a transaction (the provider call), and every step is safe to repeat, so a task
    that crashed mid-way simply runs again: the provider's cancel is idempotent,
    our mark is a conditional update of a pending payment. A charge the payer
    confirmed before the cancel reached the provider cannot be cancelled: it is
    settled from the provider's answer, and `payment_settle` refunds it because
    the order no longer takes the money (as its own callback would, once).
    """
    order = Order.objects.get(pk=order_id)
    if order_takes_payment(order):
        return []  # it may still be paid through the provider
    # Closed ones too: a charge opened after we cancelled, or after beat's re-drive
    # failed the payment (see `payment_record_charge`), is cancelled at the
    # provider all the same.
    payments = list(
        Payment.objects.filter(
            Q(status__in=[Payment.Status.PENDING, Payment.Status.CANCELLED])
            | Q(charge_cancel=Payment.ChargeCancel.PENDING),
            order_id=order_id,
            method=Payment.Method.PROVIDER,
        ).order_by("-pk")
    )
    if not payments:
        return []
    # The transactions recorded before the provider's answer: a pay request that stood
    # between its steps may open and record its charge after the provider answered
    # "no charge" and before our marks below (it then finds its payment still
    # pending, and sends no cancel of its own).
    recorded = {p.pk: p.provider_txn_id for p in payments}
    try:
        charge = provider_charge_cancel(merchant_order_no=order.merchant_order_no)
    except ProviderRefused:
        charge = provider_charge_get(merchant_order_no=order.merchant_order_no)
        if charge is None or charge.status not in _COLLECTED:
            raise
    if charge is not None and charge.status in _COLLECTED:
        return [payment_apply_charge(payment_id=payments[0].pk, charge=charge)]
    closed = [
        payment_cancel(payment_id=p.pk, recorded_txn_id=recorded[p.pk])
        for p in payments
        if p.status == Payment.Status.PENDING
    ]
    _charge_cancel_confirmed(recorded, charge)
    if any(p.status == Payment.Status.PENDING for p in closed):
        # A charge was recorded meanwhile: it exists at the provider now, and the
        # next round cancels it (a transaction, once recorded, never changes).
        return payment_cancel_open_charges(order_id=order_id)
    return closed


def _charge_cancel_confirmed(
    recorded: dict[int, str], charge: ProviderCharge | None
) -> None:
    """Mark confirmed the cancel of the charges the provider just said are closed:
    of each cancelled payment whose transaction, recorded before the provider was
    asked, is the one it cancelled (or it has no charge under the order's number at
    all: nothing there can be paid). One conditional UPDATE; a repeat changes
    nothing."""
    closed_txns = {p: txn for p, txn in recorded.items() if txn}
    if charge is not None:
        cancelled = charge.status == "CANCELLED"
        closed_txns = {
            p: t for p, t in closed_txns.items() if cancelled and t == charge.txn_id
        }
    if closed_txns:
        Payment.objects.filter(pk__in=closed_txns, status__in=_CLOSED_UNPAID).exclude(
            charge_cancel=Payment.ChargeCancel.CONFIRMED
        ).update(
            charge_cancel=Payment.ChargeCancel.CONFIRMED, charge_cancelled_at=Now()
        )


def shipment_create(*, order_id: int) -> Shipment | None:
    """Create the order's one shipment and enqueue its task after commit; every
    way an order gets paid calls it (a wallet payment, a capture, a provider's
    success), in the transaction that marks the order paid.

    The unique order on `Shipment` is the guard: a second attempt creates nothing
    and enqueues nothing (`INSERT ... ON CONFLICT DO NOTHING`, no savepoint).
    Returns the new shipment, or None if it existed.
    """
    shipment = Shipment(order_id=order_id)
    if not insert_unless_exists(shipment, ["order_id"]):
        return None
    enqueue_on_commit(DISPATCH_SHIPMENT, shipment.pk)
    return shipment


def shipment_create_for_paid_order(*, order_id: int) -> Shipment | None:
    """Create the shipment of an order that is paid but has none (wallet payments
    and captures made before every way of paying created one), once; None if the
    order is not `paid` or already has its shipment.

    Runs in the caller's transaction, under the order's lock: a refund racing it
    (which takes the same lock) comes either first, and nothing ships, or after.
    """
    locked = Order.objects.select_for_update().filter(pk=order_id)
    if locked.values_list("status", flat=True).first() != Order.Status.PAID:
        return None
    return shipment_create(order_id=order_id)


def shipment_dispatch(*, shipment_id: int) -> bool:
    """Hand a pending shipment to the warehouse; True if it moved (once).

    A refund cancels its order's pending shipment (`payment_refund`); one that
    stayed pending though its order was refunded (by a release before refunds
    did, or a process of it during a rolling deploy) is cancelled here instead
    of sent. Each step is a conditional update of a pending shipment."""
    pending = Shipment.objects.filter(pk=shipment_id, status=Shipment.Status.PENDING)
    if pending.filter(order__status=Order.Status.REFUNDED).update(
        status=Shipment.Status.CANCELLED
    ):
        return False
    return bool(
        pending.update(status=Shipment.Status.DISPATCHED, dispatched_at=timezone.now())
    )


def _callback_payment(payload: dict) -> Payment:
    """The provider payment a callback speaks of, or `CallbackMismatch`."""
    payment = (
        Payment.objects.select_related("order")
        .filter(
            method=Payment.Method.PROVIDER,
            order__merchant_order_no=payload["merchant_order_no"],
        )
        .order_by("-id")
        .first()
    )
    if payment is None:
        raise CallbackMismatch("No provider payment of ours for that order.")
    if payment.amount != payload["amount"] or (
        payment.provider_txn_id
        and payment.provider_txn_id != payload["provider_txn_id"]
    ):
        # A charge of another amount booked and given back by the re-drive
        # (`payment_settle`) on an earlier payment of the order, which another pay
        # attempt followed: its callback is that payment's, acknowledged and then
        # changing nothing, never refused for the later payment's amount.
        booked = (
            Payment.objects.select_related("order")
            .filter(
                method=Payment.Method.PROVIDER,
                order_id=payment.order_id,
                provider_txn_id=payload["provider_txn_id"],
                amount=payload["amount"],
                journal_entry__isnull=False,
            )
            .exclude(provider_txn_id="")
            .order_by("-id")
            .first()
        )
        if booked is not None:
            return booked
    if payment.amount != payload["amount"]:
        raise CallbackMismatch(
            f"The callback's amount {payload['amount']} is not the payment's "
            f"{payment.amount}."
        )
    if (
        payment.provider_txn_id
        and payment.provider_txn_id != payload["provider_txn_id"]
    ):
        raise CallbackMismatch("The callback's provider transaction is not ours.")
    return payment


def provider_event_receive(
    *, payload: dict, raw_body: str
) -> tuple[ProviderEvent, bool]:
    """Store a verified callback in the inbox, once; (event, created).

    A known `event_id` (a redelivery) returns the stored event and changes nothing;
    if it is still unprocessed its task is sent again, because the process that
    stored it may have died between the commit and the enqueue (the provider
    redelivers precisely because it got no answer), and the task is a no-op if it
    already ran. A callback that matches no payment of ours raises
    `CallbackMismatch` and stores nothing. A new event commits with its processing
    task enqueued after commit.
    """

    existing = ProviderEvent.objects.filter(event_id=payload["event_id"]).first()
    if existing is not None:
        _same_event(existing, payload)
        if existing.status == ProviderEvent.Status.RECEIVED:
            enqueue_on_commit(PROCESS_EVENT, existing.pk)
        return existing, False
    event = ProviderEvent(
        event_id=payload["event_id"],
        payment=_callback_payment(payload),
        kind=payload["status"],
        payload=payload,
        raw_body=raw_body,
    )
    if not insert_unless_exists(event, ["event_id"]):
        # The same event, delivered twice at the same instant: the other stored it.
        existing = ProviderEvent.objects.get(event_id=payload["event_id"])
        _same_event(existing, payload)
        return existing, False
    enqueue_on_commit(PROCESS_EVENT, event.pk)
    return event, True


# What an event says; a redelivery says the same (its signature, time and nonce
# are new).
_EVENT_FIELDS = ("merchant_order_no", "provider_txn_id", "status", "amount")


def _same_event(stored: ProviderEvent, payload: dict) -> None:
    """Refuse (`CallbackEventReused`, logged) a callback whose `event_id` is a
    stored event's but which says something else: acknowledged as a redelivery,
    the second event would vanish unseen (a provider reusing ids, say one per
    transaction, would have its success dropped)."""
    differs = [
        name for name in _EVENT_FIELDS if stored.payload.get(name) != payload.get(name)
    ]
    if differs:
        logger.warning(
            "provider event %s delivered again with another %s; refused",
            stored.event_id,
            ", ".join(differs),
        )
        raise CallbackEventReused(
            f"Event {stored.event_id} was delivered before with another "
            f"{', '.join(differs)}; the first one stands.",
            fields=differs,
        )


def provider_event_process(*, event_id: int) -> ProviderEvent:
    """Apply a stored callback, once: settle or fail its payment, mark it processed.

    The event row is locked and re-read: processed already (a redelivered task) or
    parked is a no-op. Settling is itself idempotent, so two events reporting
    success for one payment settle it once. A failed attempt is counted on the
    event; see `_provider_event_apply`.
    """
    with transaction.atomic(savepoint=False):
        event = ProviderEvent.objects.select_for_update().get(pk=event_id)
        if event.status == ProviderEvent.Status.RECEIVED:
            _provider_event_apply(event)
    return event


def _provider_event_apply(event: ProviderEvent) -> None:
    """Apply a received event whose row the caller holds locked, and save it.

    The effect runs in a savepoint. If it fails for any reason but a lost database
    connection (which the task retries), the effect rolls back to the savepoint and
    the attempt is recorded instead (`attempts`, `last_error`); after
    PROVIDER_EVENT_MAX_ATTEMPTS failed attempts the event is `parked`: kept, no
    longer re-driven by beat, counted by `/metrics` and `check_ledger`, until an
    operator re-drives it (`provider_event_redrive`). A business refusal (a frozen
    merchant account) would otherwise be re-driven every minute for ever.

    An event about a charge that is not its payment's (`_not_its_charge`: one
    stored before the payment recorded its own) changes nothing and is processed
    with the outcome `ProviderEvent.NOT_ITS_CHARGE`, which the admin filters and
    `/metrics` counts; it is never applied or retried.
    """
    txn = event.payload.get("provider_txn_id", "")
    try:
        with transaction.atomic():  # a savepoint: a failure rolls back to it
            order, payment = _lock(event.payment_id)
            if _not_its_charge(payment, txn):
                outcome = ProviderEvent.NOT_ITS_CHARGE
            else:
                # Under the locks just taken, the charge checked once: what
                # `payment_settle` and `payment_fail` do after their own check.
                if event.kind == "SUCCESS":
                    payment = _settle_its_charge(
                        order, payment, txn, event.payload.get("amount")
                    )
                else:
                    payment = _close_its_charge(payment, "fail")
                outcome = f"payment {payment.status}"
    except (OperationalError, InterfaceError):
        raise  # the database itself: the task's retries, not a failed attempt
    except Exception as exc:
        event.attempts += 1
        code = getattr(exc, "code", "")
        event.last_error = f"{type(exc).__name__}{f' {code}' if code else ''}: {exc}"
        fields = ["attempts", "last_error"]
        if event.attempts >= settings.PROVIDER_EVENT_MAX_ATTEMPTS:
            event.status = ProviderEvent.Status.PARKED
            event.parked_at = timezone.now()
            fields += ["status", "parked_at"]
            logger.error(
                "provider event %s parked after %d failed attempts: %s",
                event.event_id,
                event.attempts,
                event.last_error,
            )
        else:
            logger.warning(
                "provider event %s failed (attempt %d): %s",
                event.event_id,
                event.attempts,
                event.last_error,
            )
        event.save(update_fields=fields)
        return
    event.status = ProviderEvent.Status.PROCESSED
    event.outcome = outcome
    event.processed_at = timezone.now()
    event.save(update_fields=["status", "outcome", "processed_at"])


def provider_event_redrive(*, event_id: int) -> tuple[ProviderEvent, bool]:
    """Process a parked event again, now, once: the operator fixed the cause.
    Returns (event, whether it was parked and so re-driven).

    One transaction under the event's row lock: only a parked event moves (back to
    `received`, with a fresh budget of attempts) and is applied at once, so a second
    press, or two operators racing, find it no longer parked and do nothing; the
    ledger's unique references stop a second movement in any case. If it fails
    again the failure is recorded as a first attempt, and beat re-drives it until it
    is parked again.
    """
    with transaction.atomic(savepoint=False):
        event = ProviderEvent.objects.select_for_update().get(pk=event_id)
        if event.status != ProviderEvent.Status.PARKED:
            return event, False
        event.status = ProviderEvent.Status.RECEIVED
        event.attempts = 0
        event.parked_at = None
        event.save(update_fields=["status", "attempts", "parked_at"])
        _provider_event_apply(event)
    return event, True


def payment_redrive(*, payment_id: int) -> Payment:
    """Ask the provider how a long-pending payment stands, and act on its answer.

    Never inside a transaction (the client refuses): the answer then goes through
    the same idempotent services a callback uses (`payment_apply_charge`), so a
    callback arriving at the same moment, or another re-drive, settles it once.
    The provider has no charge: the pay request never got that far, so the payment
    fails and the order may be paid again (unless the request, resumed meanwhile,
    recorded the charge it opened since the provider answered: then it stays
    pending; one that records it on the failed payment records it on the order's
    payment opened again, see `payment_record_charge`). Collected for another
    amount than asked, or collected and refunded at the provider: the money is
    booked and given back, never kept as the order's payment. A payment a callback
    settled while this asked is brought to the provider's answer too (a charge
    refunded there is refunded here). An order that no longer takes money (paid
    another way, cancelled) has its charge cancelled instead of waited on.

    An answer the ledger refuses to apply (the money cannot leave a frozen or closed
    account) rolls back whole and is counted on the payment, which is parked after
    PAYMENT_REDRIVE_MAX_ATTEMPTS of them (`_redrive_refused`); a parked payment is
    left alone until staff re-drive it (`payment_redrive_parked`).
    """
    payment = Payment.objects.select_related("order").get(pk=payment_id)
    if payment.method != Payment.Method.PROVIDER or payment.status not in (
        Payment.Status.PENDING,
        Payment.Status.SUCCEEDED,
    ):
        return payment
    if payment.redrive_parked_at is not None:
        return payment  # waits for staff: `payment_redrive_parked`
    try:
        if payment.status == Payment.Status.PENDING and not order_takes_payment(
            payment.order
        ):
            payment_cancel_open_charges(order_id=payment.order_id)
            return Payment.objects.get(pk=payment.pk)
        charge = provider_charge_get(merchant_order_no=payment.order.merchant_order_no)
        # Its pay request, resumed meanwhile, may have opened and recorded a charge
        # since the provider answered: that payment stays pending.
        applied = payment_apply_charge(
            payment_id=payment.pk,
            charge=charge,
            recorded_txn_id=payment.provider_txn_id,
        )
    except AccountNotActive as refused:
        return _redrive_refused(payment.pk, refused)
    return _redrive_applied(applied)


def _redrive_refused(payment_id: int, refused: AccountNotActive) -> Payment:
    """Count a re-drive the ledger refused (its transaction rolled back, nothing
    of the answer applied), keep the error for staff, and park the payment after
    PAYMENT_REDRIVE_MAX_ATTEMPTS of them: `payments_stuck` no longer picks it, so
    beat stops asking the provider every rotation about a payment whose answer
    cannot be applied until staff fix the cause (an account frozen or closed).
    One conditional update of a payment not parked already, so re-drives racing
    each other count each refusal and park it once."""
    error = f"{type(refused).__name__} {refused.code}: {refused}"
    last = settings.PAYMENT_REDRIVE_MAX_ATTEMPTS - 1  # attempts before this one
    Payment.objects.filter(pk=payment_id, redrive_parked_at__isnull=True).update(
        redrive_attempts=F("redrive_attempts") + 1,
        redrive_error=error,
        redrive_parked_at=Case(When(redrive_attempts__gte=last, then=Now())),
    )
    payment = Payment.objects.get(pk=payment_id)
    if payment.redrive_parked_at is not None:
        logger.error(
            "payment %s parked after %d refused re-drives: %s",
            payment_id,
            payment.redrive_attempts,
            error,
        )
    else:
        logger.warning(
            "the re-drive of payment %s was refused (attempt %d): %s",
            payment_id,
            payment.redrive_attempts,
            error,
        )
    return payment


def _redrive_applied(payment: Payment) -> Payment:
    """Forget the refusals counted on a payment whose answer the ledger took this
    time (its cause was fixed): parking counts refusals in a row, and the error
    would otherwise stay on a payment that has settled. One conditional update of a
    payment not parked, so one a racing refusal parked meanwhile keeps its error for
    staff."""
    if not (payment.redrive_attempts or payment.redrive_error):
        return payment  # nothing to forget: no write on every re-drive
    Payment.objects.filter(pk=payment.pk, redrive_parked_at__isnull=True).update(
        redrive_attempts=0, redrive_error=""
    )
    return Payment.objects.get(pk=payment.pk)


def payment_redrive_parked(*, payment_id: int) -> tuple[Payment, bool]:
    """Re-drive a parked payment again, now, once: staff fixed the cause (unfroze
    the merchant's account). Returns (payment, whether it was parked and so
    re-driven).

    Never inside a transaction (the provider call). Unparking is one conditional
    update of a parked payment, with a fresh budget of attempts, so a second press,
    or two staff members racing, find it no longer parked and do nothing; the
    services the re-drive applies the answer through move the money once in any
    case. Refused again, the refusal is counted as a first attempt, and beat
    re-drives it until it is parked again.
    """
    unparked = Payment.objects.filter(
        pk=payment_id, redrive_parked_at__isnull=False
    ).update(redrive_parked_at=None, redrive_attempts=0)
    if not unparked:
        return Payment.objects.get(pk=payment_id), False
    return payment_redrive(payment_id=payment_id), True


def payments_stuck(*, older_than_seconds: int, limit: int = 100) -> list[int]:
    """Ids of up to `limit` provider payments pending longer than
    `older_than_seconds` (by the database's clock, which also stamped them), the
    provider asked about least recently first (never asked: first of all), each
    stamped as asked now. So every one is asked in its turn: checkouts left open
    by the hundred (each still pending at the provider, asked again every run)
    cannot keep a later payment, paid but its notification lost, from being asked.
    """
    cutoff = DatabaseNow(plus=-timedelta(seconds=older_than_seconds))
    stuck = Payment.objects.filter(
        method=Payment.Method.PROVIDER,
        status=Payment.Status.PENDING,
        created_at__lt=cutoff,
        # Parked: staff re-drive it once its cause is fixed.
        redrive_parked_at__isnull=True,
    )
    return _least_recently_asked(stuck, limit)


# Payments a reconciliation run moves out of (or back into) its window in one
# statement: those settled in a minute, a month ago, are far fewer.
RETIRE_BATCH = 1000


def payments_to_reconcile(
    *, settled_within_seconds: int, asked_every_seconds: int, limit: int = 100
) -> list[int]:
    """Ids of up to `limit` provider payments settled within the last
    `settled_within_seconds` and not asked about for `asked_every_seconds`, the
    least recently asked first, each stamped as asked now (by the database's
    clock, as `payments_stuck`, which shares the stamp and the locking).

    The provider's callbacks report a charge's success or failure, never a refund
    made at the provider (its dashboard, a chargeback): only asking finds it. A run
    that dies after its commit leaves its payments stamped; they come round again
    `asked_every_seconds` later.
    """
    settled_since = DatabaseNow(plus=-timedelta(seconds=settled_within_seconds))
    asked_before = DatabaseNow(plus=-timedelta(seconds=asked_every_seconds))
    settled = Payment.objects.filter(
        method=Payment.Method.PROVIDER, status=Payment.Status.SUCCEEDED
    )
    # Keep the index of payments to ask about to the window's payments (move the
    # few that left it since the last run, and those a window made wider takes in
    # again), so that the batch is found without reading the window's payments,
    # let alone every success ever made. The window's condition stays below: a
    # payment another transaction held, left in the index past the window until
    # the next run, is not asked about.
    _retire(
        settled.filter(reconcile_retired=True, succeeded_at__gte=settled_since),
        False,
    )
    _retire(
        settled.filter(reconcile_retired=False, succeeded_at__lt=settled_since),
        True,
    )
    due = settled.filter(
        reconcile_retired=False,
        succeeded_at__gte=settled_since,
        # Parked (its refund refused): staff re-drive it, as a stuck one.
        redrive_parked_at__isnull=True,
    )
    return _least_recently_asked(due, limit, asked_before=asked_before)


def _retire(payments: QuerySet[Payment], retired: bool) -> None:
    """Mark `payments` past (or within) the reconciliation's window, those no other
    transaction holds (the next run moves them).

    RETIRE_BATCH at a time, in the order of the index that finds them: the planner
    cannot know that hardly any settled payment is on the wrong side of the window
    (the column is false on nearly every other payment) and, without a bound,
    could read the whole table for the few. The ids first for the same reason: an
    update whose condition is a subquery gets a plan that joins the whole table.
    Each batch commits on its own: a window made much narrower moves many
    payments in one run, and a refund of one of them waits only for its batch.
    """
    free = payments.order_by("succeeded_at").select_for_update(skip_locked=True)
    while True:
        with transaction.atomic(savepoint=False):
            ids = list(free.values_list("pk", flat=True)[:RETIRE_BATCH])
            Payment.objects.filter(pk__in=ids).update(reconcile_retired=retired)
        if len(ids) < RETIRE_BATCH:
            return


def _least_recently_asked(
    payments: QuerySet[Payment],
    limit: int,
    *,
    asked_before: DatabaseNow | None = None,
) -> list[int]:
    """Ids of up to `limit` of `payments` never asked about or (if `asked_before`)
    last asked before it, the least recently asked first (never asked: first of
    all, by id), each stamped as asked now in the same transaction. Rows another
    run holds are skipped: two runs at once (a beat's run overlapping the next)
    share the work instead of both asking about the same payments.

    Two walks of an index by (`provider_asked_at`, id), each with its condition on
    the index and stopping at the batch, in place of one query whose "never asked
    or asked before" only a filter can check: that one reads every payment asked
    since when fewer than a batch are due."""
    with transaction.atomic(savepoint=False):
        locked = payments.select_for_update(skip_locked=True)
        # Ordered as the index is (all the never asked have the same, empty
        # stamp): by id alone, the planner walks the primary key from the oldest
        # payment ever made, hoping to meet the batch early.
        in_order = ("provider_asked_at", "pk")
        never = locked.filter(provider_asked_at__isnull=True).order_by(*in_order)
        ids = list(never.values_list("pk", flat=True)[:limit])
        if len(ids) < limit:
            asked = (
                locked.filter(provider_asked_at__isnull=False)
                if asked_before is None
                else locked.filter(provider_asked_at__lt=asked_before)
            )
            ids += asked.order_by(*in_order).values_list("pk", flat=True)[
                : limit - len(ids)
            ]
        Payment.objects.filter(pk__in=ids).update(provider_asked_at=Now())
    return ids


def refunds_to_return(*, older_than_seconds: int, limit: int = 500) -> list[int]:
    """Ids of refunds still to be returned by the provider `older_than_seconds`
    after they were made: their task was lost, or the provider did not answer."""
    cutoff = DatabaseNow(plus=-timedelta(seconds=older_than_seconds))
    return list(
        Refund.objects.filter(
            at_provider=Refund.AtProvider.PENDING, created_at__lt=cutoff
        )
        .order_by("pk")
        .values_list("pk", flat=True)[:limit]
    )


def charges_to_cancel(*, older_than_seconds: int, limit: int = 500) -> list[int]:
    """Ids of the orders of closed provider payments whose charge, opened after
    they were closed, the provider has not confirmed cancelled `older_than_seconds`
    after it was recorded: their task was lost, or the provider did not answer."""
    pending = charges_not_cancelled(older_than_seconds=older_than_seconds)
    return list(
        pending.order_by("order_id")
        .values_list("order_id", flat=True)
        .distinct()[:limit]
    )


def charges_not_cancelled(*, older_than_seconds: int) -> QuerySet[Payment]:
    """Closed provider payments (cancelled, or failed by beat's re-drive) whose
    charge's cancel the provider has not confirmed `older_than_seconds` after it was
    recorded (by the database's clock), oldest first."""
    cutoff = DatabaseNow(plus=-timedelta(seconds=older_than_seconds))
    return Payment.objects.filter(
        method=Payment.Method.PROVIDER,
        status__in=_CLOSED_UNPAID,
        charge_cancel=Payment.ChargeCancel.PENDING,
        updated_at__lt=cutoff,
    ).order_by("pk")


def inbox_stuck(*, older_than_seconds: int, limit: int = 500) -> tuple[list, list]:
    """(provider event ids, shipment ids) still waiting `older_than_seconds` after
    they were stored: their task was lost (a broker outage) or is failing."""
    cutoff = DatabaseNow(plus=-timedelta(seconds=older_than_seconds))
    events = ProviderEvent.objects.filter(
        status=ProviderEvent.Status.RECEIVED, received_at__lt=cutoff
    ).order_by("pk")
    shipments = Shipment.objects.filter(
        status=Shipment.Status.PENDING, created_at__lt=cutoff
    ).order_by("pk")
    return (
        list(events.values_list("pk", flat=True)[:limit]),
        list(shipments.values_list("pk", flat=True)[:limit]),
    )
