"""Payments' Celery tasks: thin, by id, each one safe to run twice.

`acks_late` (also the project default) means a task is acknowledged only after it
ran, so a worker killed mid-task gets it redelivered; every service called here
re-reads its rows under a lock and returns early when the work is already done.
"""

import logging
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import DatabaseError, transaction

from ledger.exceptions import DomainError

from . import services
from .exceptions import ProviderUnavailable

logger = logging.getLogger(__name__)

RETRY: dict[str, Any] = {
    "acks_late": True,
    "autoretry_for": (DatabaseError, ConnectionError, OSError),
    "max_retries": 8,
    "retry_backoff": 2,  # 2 s, 4 s, 8 s ... exponential
    "retry_backoff_max": 600,
    "retry_jitter": True,
}
# Tasks that call the provider also retry while it does not answer.
RETRY_PROVIDER: dict[str, Any] = {
    **RETRY,
    "autoretry_for": (*RETRY["autoretry_for"], ProviderUnavailable),
}


@shared_task(**RETRY)
def provider_event_process_task(event_id: int) -> str:
    """Apply one stored provider callback (a failed attempt is counted on the event,
    which is parked after PROVIDER_EVENT_MAX_ATTEMPTS of them)."""
    return services.provider_event_process(event_id=event_id).status


@shared_task(**RETRY)
def shipment_dispatch_task(shipment_id: int) -> bool:
    """Hand the order's one shipment to the warehouse."""
    return services.shipment_dispatch(shipment_id=shipment_id)


@shared_task
def purge_expired_nonces() -> int:
    """Delete callback nonces past their expiry."""
    from .signatures import nonce_purge_expired

    return nonce_purge_expired()


@shared_task
def redrive_pending_payments() -> int:
    """Ask the provider about provider payments pending past the timeout; each is
    re-driven by its own task so one slow answer does not hold up the rest."""
    ids = services.payments_stuck(
        older_than_seconds=settings.PAYMENT_PENDING_TIMEOUT_SECONDS
    )
    for payment_id in ids:
        payment_redrive_task.delay(payment_id)
    return len(ids)


@shared_task
def reconcile_settled_payments() -> int:
    """Ask the provider about provider payments settled lately (a batch of the
    least recently asked, each at most every PAYMENT_RECONCILE_EVERY_SECONDS), so
    that a charge refunded at the provider is refunded here too; each is asked by
    its own task, as a stuck one is."""
    ids = services.payments_to_reconcile(
        settled_within_seconds=settings.PAYMENT_RECONCILE_WINDOW_SECONDS,
        asked_every_seconds=settings.PAYMENT_RECONCILE_EVERY_SECONDS,
        limit=settings.PAYMENT_RECONCILE_BATCH,
    )
    for payment_id in ids:
        payment_redrive_task.delay(payment_id)
    return len(ids)


@shared_task(**RETRY_PROVIDER)
def payment_redrive_task(payment_id: int) -> str:
    """Bring one stuck or settled payment to the provider's answer: settle or fail
    it, or refund it if the provider refunded its charge."""
    return services.payment_redrive(payment_id=payment_id).status


@shared_task(**RETRY_PROVIDER)
def payment_cancel_open_charges_task(order_id: int) -> int:
    """Cancel at the provider the open charge of an order paid another way; the
    number of our payments it closed."""
    return len(services.payment_cancel_open_charges(order_id=order_id))


@shared_task(**RETRY_PROVIDER)
def refund_return_at_provider_task(refund_id: int) -> bool:
    """Have the provider give a refunded provider payment's money back to the
    payer (once, however often it runs)."""
    return services.refund_return_at_provider(refund_id=refund_id)


@shared_task
def cancel_expired_orders() -> int:
    """Cancel orders unpaid past ORDER_UNPAID_EXPIRY_SECONDS."""
    from orders.services import order_cancel_expired

    return order_cancel_expired(older_than_seconds=settings.ORDER_UNPAID_EXPIRY_SECONDS)


@shared_task
def redrive_inbox() -> int:
    """Send again the tasks of provider events, shipments, refunds to return at
    the provider and charges to cancel there that still wait a minute after they
    were made (each task is a no-op if it already ran); a parked event waits for an
    operator instead."""
    events, shipments = services.inbox_stuck(older_than_seconds=60)
    for event_id in events:
        provider_event_process_task.delay(event_id)
    for shipment_id in shipments:
        shipment_dispatch_task.delay(shipment_id)
    refunds = services.refunds_to_return(older_than_seconds=60)
    for refund_id in refunds:
        refund_return_at_provider_task.delay(refund_id)
    orders = services.charges_to_cancel(older_than_seconds=60)
    for order_id in orders:
        payment_cancel_open_charges_task.delay(order_id)
    return len(events) + len(shipments) + len(refunds) + len(orders)


@shared_task
def expire_holds() -> int:
    """Expire authorized payments whose hold is past `expires_at`: the hold is
    released, the payment `expired`, the order `cancelled`. Each in its own
    transaction; safe when two beats run it at once (the loser finds the hold no
    longer active and changes nothing). Returns how many it expired."""
    expired = 0
    for payment_id in services.payments_hold_expired():
        try:
            with transaction.atomic(durable=True):
                _, moved = services.payment_expire(payment_id=payment_id)
        except DomainError:
            logger.exception(
                "could not expire payment %s; next beat retries", payment_id
            )
            continue
        expired += moved
    return expired
