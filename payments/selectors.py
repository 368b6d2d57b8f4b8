from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import Http404, HttpRequest
from django.shortcuts import get_object_or_404
from django.urls import reverse

from orders.models import Order

from .models import Payment, ProviderEvent


def paid_orders_without_shipment() -> QuerySet[Order]:
    """Orders paid (and neither shipped nor refunded since) that have no shipment:
    none should exist, as every way of paying creates it with the payment."""
    return Order.objects.filter(
        status=Order.Status.PAID, shipment__isnull=True
    ).order_by("pk")


def payments_parked() -> QuerySet[Payment]:
    """Provider payments whose re-drive is parked for staff (the ledger refused its
    answer PAYMENT_REDRIVE_MAX_ATTEMPTS times), oldest first; found through the
    partial index `payment_redrive_parked`. Only those still waiting for the
    provider's answer to be applied: one settled since another way (a callback, the
    customer's own refund) stays stamped parked, with nothing left to re-drive."""
    return Payment.objects.filter(
        redrive_parked_at__isnull=False,
        status__in=[Payment.Status.PENDING, Payment.Status.SUCCEEDED],
    ).order_by("pk")


def payments_heard_of_another_charge() -> QuerySet[Payment]:
    """Provider payments whose re-drive or reconciliation heard the provider
    answer about a charge that is not theirs (`other_charge_txn_id`), oldest
    first; found through the partial index `payment_other_charge_heard`."""
    return Payment.objects.exclude(other_charge_txn_id="").order_by("pk")


def other_charges_collected_in_events(events: QuerySet[ProviderEvent]) -> list[str]:
    """The provider charges that callbacks among `events` reported collected in an
    answer about another charge than their payment's: what `check_ledger` names
    until a payment books them or staff take them up with the provider."""
    payloads = events.filter(
        outcome=ProviderEvent.NOT_ITS_CHARGE, kind="SUCCESS"
    ).values_list("payload", flat=True)
    return sorted({payload.get("provider_txn_id") or "" for payload in payloads} - {""})


def other_charges_collected_on_payments(payments: QuerySet[Payment]) -> list[str]:
    """The provider charges that the re-drive or reconciliation of `payments` heard
    were collected, in an answer about another charge than theirs (as
    `other_charges_collected_in_events`)."""
    txns = (
        payments.filter(other_charge_status="SUCCESS")
        .exclude(other_charge_txn_id="")
        .values_list("other_charge_txn_id", flat=True)
    )
    return sorted(set(txns))


def payment_list(*, order: Order) -> QuerySet[Payment]:
    """The order's payments, newest first."""
    return Payment.objects.filter(order=order).order_by("-id")


def payment_history(*, owner: User) -> QuerySet[Payment]:
    """All the owner's payments with their orders (and refunds), newest first."""
    return (
        Payment.objects.filter(order__owner=owner)
        .select_related("order", "refund_record")
        .order_by("-id")
    )


def payment_get(*, owner: User, payment_id: int) -> Payment:
    """The owner's payment; 404 for anyone else's or an unknown one."""
    if not 0 < payment_id < 2**63:
        raise Http404("no such payment")
    return get_object_or_404(
        Payment.objects.select_related("order", "refund_record", "hold"),
        pk=payment_id,
        order__owner=owner,
    )


def order_page_url(request: HttpRequest, merchant_order_no: str) -> str:
    """The shopper's page of an order, as an absolute URL (the provider's pay page
    links back to it)."""
    return request.build_absolute_uri(reverse("order-detail", args=[merchant_order_no]))
