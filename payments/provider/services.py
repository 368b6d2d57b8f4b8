"""The simulator's state changes."""

import json
import secrets
from datetime import timedelta

import httpx
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger.exceptions import DomainError
from payments.services import enqueue_on_commit
from payments.signatures import sign

from .models import Charge, Notification

DELIVER_NOTIFICATION = "payments.provider.tasks.notification_deliver_task"


class ChargeConflict(DomainError):
    status = 409
    code = "provider_charge_conflict"
    title = "Charge conflicts with an earlier one"


def charge_create(
    *,
    merchant_order_no: str,
    amount: int,
    currency: str,
    description: str = "",
    return_url: str = "",
) -> tuple[Charge, bool]:
    """Open a charge, or return the one this merchant order number already has.

    `return_url` is where the pay page sends the payer back when they are done; the
    first request's is kept.

    Within the dedupe window the same request gets the same transaction back (the
    merchant's retry); a different amount, or a number reused after the window, is a
    conflict. The unique merchant order number settles concurrent duplicates.
    """
    existing = Charge.objects.filter(merchant_order_no=merchant_order_no).first()
    if existing is None:
        try:
            with transaction.atomic():
                return (
                    Charge.objects.create(
                        txn_id=f"P{secrets.token_hex(12)}",
                        merchant_order_no=merchant_order_no,
                        amount=amount,
                        currency=currency,
                        description=description,
                        return_url=return_url,
                    ),
                    True,
                )
        except IntegrityError:
            existing = Charge.objects.get(merchant_order_no=merchant_order_no)
    window = timedelta(seconds=settings.PROVIDER_DEDUPE_WINDOW_SECONDS)
    if existing.created_at < timezone.now() - window:
        raise ChargeConflict("This merchant order number was used long ago.")
    if (existing.amount, existing.currency) != (amount, currency):
        raise ChargeConflict("This merchant order number was charged another amount.")
    if existing.status == Charge.Status.FAILED:
        # The payer declined; the merchant asks again: the same charge reopens.
        Charge.objects.filter(pk=existing.pk, status=Charge.Status.FAILED).update(
            status=Charge.Status.PENDING, settled_at=None
        )
        existing.refresh_from_db()
    return existing, False


def charge_cancel(*, merchant_order_no: str) -> Charge:
    """Cancel the merchant's open charge: the payer can no longer confirm it.

    One conditional update (`WHERE status IN (pending, failed)`), so it races a
    confirmation on the pay page fairly: whichever commits first wins, and the
    other finds the charge moved. Cancelled already: the same answer again. Paid
    already: `ChargeConflict` (the money is in; the merchant refunds instead).
    Unknown: `Charge.DoesNotExist`.
    """
    Charge.objects.filter(
        merchant_order_no=merchant_order_no,
        status__in=[Charge.Status.PENDING, Charge.Status.FAILED],
    ).update(status=Charge.Status.CANCELLED)
    charge = Charge.objects.get(merchant_order_no=merchant_order_no)
    if charge.status == Charge.Status.SUCCESS:
        raise ChargeConflict("This charge was paid already; it cannot be cancelled.")
    return charge


def charge_refund(*, merchant_order_no: str) -> Charge:
    """Give a paid charge's money back to the payer.

    One conditional update (`WHERE status = success`): asked again (the merchant's
    retry, a redelivered task), the charge is refunded already and the answer is
    the same; the money goes back once. Not paid (pending, declined, cancelled):
    `ChargeConflict`. Unknown: `Charge.DoesNotExist`.
    """
    Charge.objects.filter(
        merchant_order_no=merchant_order_no, status=Charge.Status.SUCCESS
    ).update(status=Charge.Status.REFUNDED, refunded_at=timezone.now())
    charge = Charge.objects.get(merchant_order_no=merchant_order_no)
    if charge.status != Charge.Status.REFUNDED:
        raise ChargeConflict(
            f"This charge is {charge.status}; only a paid one is refunded."
        )
    return charge


def charge_settle(*, txn_id: str, outcome: str) -> Charge:
    """The payer confirmed (SUCCESS) or declined (FAILED) on the pay page.

    Only a pending charge moves (a conditional update); the move creates the one
    notification the merchant is owed and enqueues its delivery after commit.
    """
    if outcome not in (Charge.Status.SUCCESS, Charge.Status.FAILED):
        raise ValueError(outcome)
    with transaction.atomic(savepoint=False):
        moved = Charge.objects.filter(
            txn_id=txn_id, status=Charge.Status.PENDING
        ).update(status=outcome, settled_at=timezone.now())
        charge = Charge.objects.get(txn_id=txn_id)
        if moved:
            attempt = charge.notifications.count() + 1
            note = Notification.objects.create(
                charge=charge, event_id=f"{txn_id}-{attempt}-{outcome}", outcome=outcome
            )
            # After commit; a broker that is down is logged, not raised (the payer's
            # confirmation has committed): beat sends a delivery whose task was lost
            # (`redeliver_lost_notifications`).
            enqueue_on_commit(DELIVER_NOTIFICATION, note.pk)
    return charge


def notification_body(note: Notification) -> bytes:
    charge = note.charge
    return json.dumps(
        {
            "event_id": note.event_id,
            "merchant_order_no": charge.merchant_order_no,
            "provider_txn_id": charge.txn_id,
            "status": note.outcome,
            "amount": charge.amount,
        }
    ).encode()


def notification_deliver(*, notification_id: int) -> bool:
    """POST the callback, freshly signed; True once the merchant answered 200.

    Never inside a transaction: the HTTP call may hang. With
    `PROVIDER_DELIVER_TWICE` the same event goes out a second time on purpose.
    """
    note = Notification.objects.select_related("charge").get(pk=notification_id)
    if note.delivered_at is not None:
        return True
    body = notification_body(note)
    times = 2 if settings.PROVIDER_DELIVER_TWICE else 1
    status = 0
    for _ in range(times):
        header = sign(secret=settings.PAYMENT_PROVIDER_SECRET, body=body)
        try:
            status = httpx.post(
                settings.PROVIDER_CALLBACK_URL,
                content=body,
                headers={
                    "Content-Type": "application/json",
                    "X-Provider-Signature": header,
                },
                timeout=10,
            ).status_code
        except httpx.HTTPError:
            status = 0
        if status != 200:
            break
    Notification.objects.filter(pk=note.pk).update(
        attempts=note.attempts + 1,
        last_status=status,
        delivered_at=timezone.now() if status == 200 else None,
    )
    return status == 200


def notifications_lost(*, older_than_seconds: float, limit: int = 500) -> list[int]:
    """Notifications whose delivery was never tried `older_than_seconds` after they
    were created: their task was lost (the broker was down when the charge settled).
    A chain of retries that has begun owns its notification, so only these count."""
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    return list(
        Notification.objects.filter(
            delivered_at__isnull=True, attempts=0, created_at__lt=cutoff
        )
        .order_by("pk")
        .values_list("pk", flat=True)[:limit]
    )
