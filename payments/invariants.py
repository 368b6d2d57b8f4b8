"""The payments app's additions to `check_ledger`: no order is paid twice, orders
and payments agree, every payment matches the ledger and its hold; and warnings
for what waits on the provider or an operator (parked callbacks, refunds not
returned, charges collected for another amount, charges not cancelled, paid
orders not shipped, charges reported collected that no payment booked)."""

from django.db.models import Count, Exists, F, OuterRef, Q

from ledger.invariants import invariant, warning_check


@invariant
def no_order_paid_twice() -> list[str]:
    """No order has more than one succeeded payment.

    The partial unique index `payment_one_success_per_order` should make this
    impossible; the check proves it on the data, e.g. after a restore or a migration.
    """
    from orders.models import Order

    from .models import Payment

    twice = (
        Order.objects.annotate(
            succeeded=Count(
                "payments", filter=Q(payments__status=Payment.Status.SUCCEEDED)
            )
        )
        .filter(succeeded__gt=1)
        .values_list("merchant_order_no", "succeeded")
    )
    return [f"order {no} paid twice: {n} succeeded payments" for no, n in twice]


@invariant
def orders_match_their_payments() -> list[str]:
    """An order keeps money exactly while it is paid: a succeeded payment's order is
    paid, shipped or completed (a success for an order cancelled meanwhile, or still
    pending or authorized, is refunded, never kept); such an order has a succeeded
    payment; a refunded order has a refunded payment."""
    from orders.models import REFUNDABLE_STATES, Order

    from .models import Payment

    def name(status: int) -> str:
        return Order.Status(status).name.lower()

    def payment_of_it(status: str) -> Exists:
        return Exists(Payment.objects.filter(order=OuterRef("pk"), status=status))

    kept = (
        Payment.objects.filter(status=Payment.Status.SUCCEEDED)
        .exclude(order__status__in=REFUNDABLE_STATES)
        .order_by("pk")
        .values_list("pk", "order__merchant_order_no", "order__status")
    )
    problems = [
        f"payment {pk} succeeded but its order {no} is {name(status)}"
        for pk, no, status in kept
    ]
    unpaid = (
        Order.objects.filter(status__in=REFUNDABLE_STATES)
        .exclude(payment_of_it(Payment.Status.SUCCEEDED))
        .order_by("pk")
        .values_list("merchant_order_no", "status")
    )
    problems += [
        f"order {no} is {name(status)} but no payment of it succeeded"
        for no, status in unpaid
    ]
    not_refunded = (
        Order.objects.filter(status=Order.Status.REFUNDED)
        .exclude(payment_of_it(Payment.Status.REFUNDED))
        .order_by("pk")
        .values_list("merchant_order_no", flat=True)
    )
    problems += [
        f"order {no} is refunded but no payment of it was refunded"
        for no in not_refunded
    ]
    return problems


@invariant
def payments_match_the_ledger() -> list[str]:
    """Every settled payment names the entry that moved its money; every refunded
    one has its one refund; nothing pending or failed has moved money."""
    from .models import Payment

    settled = (Payment.Status.SUCCEEDED, Payment.Status.REFUNDED)
    problems = [
        f"payment {pk} is {status} but names no journal entry"
        for pk, status in Payment.objects.filter(
            status__in=settled, journal_entry__isnull=True
        ).values_list("pk", "status")
    ]
    problems += [
        f"payment {pk} is refunded but has no refund"
        for pk in Payment.objects.filter(
            status=Payment.Status.REFUNDED, refund_record__isnull=True
        ).values_list("pk", flat=True)
    ]
    problems += [
        f"payment {pk} is {status} but moved money"
        for pk, status in Payment.objects.exclude(status__in=settled)
        .filter(journal_entry__isnull=False)
        .values_list("pk", "status")
    ]
    return problems


# A payment with a hold and the status its hold must have.
HOLD_STATUS_OF = {
    "authorized": "active",
    "succeeded": "captured",
    "refunded": "captured",
    "voided": "voided",
    "expired": "expired",
}


@invariant
def payments_match_their_holds() -> list[str]:
    """An authorized payment's hold is active; a captured one's captured; a voided
    or expired one's voided or expired: the payment and its hold end together."""
    from .models import Payment

    rows = Payment.objects.filter(hold__isnull=False).values_list(
        "pk", "status", "hold__status"
    )
    problems = [
        f"payment {pk} is {status} but its hold is {hold_status}"
        for pk, status, hold_status in rows
        if HOLD_STATUS_OF.get(status) != hold_status
    ]
    problems += [
        f"payment {pk} is {status} but has no hold"
        for pk, status in Payment.objects.filter(
            status__in=["authorized", "voided", "expired"], hold__isnull=True
        ).values_list("pk", "status")
    ]
    return problems


@warning_check
def provider_events_parked() -> list[str]:
    """Provider callbacks parked after failing: money the provider reported that we
    have not applied yet. Not a broken invariant, but an operator must fix the cause
    and re-drive them (`manage.py redrive_provider_events`)."""
    from .models import ProviderEvent

    parked = ProviderEvent.objects.filter(
        status=ProviderEvent.Status.PARKED
    ).values_list("event_id", "payment_id", "attempts", "last_error")
    return [
        f"provider event {event_id!r} (payment {payment_id}) parked after "
        f"{attempts} failed attempts: {error}"
        for event_id, payment_id, attempts, error in parked.order_by("pk")
    ]


@warning_check
def provider_payments_parked() -> list[str]:
    """Provider payments beat stopped re-driving after its re-drive was refused
    `PAYMENT_REDRIVE_MAX_ATTEMPTS` times (the provider's answer cannot be applied:
    an account frozen or closed). Staff fix the cause and re-drive them from the
    admin (Payments, filter "re-drive parked") or with `manage.py
    redrive_parked_payments`."""
    from .selectors import payments_parked

    parked = payments_parked().values_list(
        "pk", "order__merchant_order_no", "redrive_attempts", "redrive_error"
    )
    return [
        f"payment {pk} (order {order_no}) parked after {attempts} refused "
        f"re-drives: {error}"
        for pk, order_no, attempts, error in parked.order_by("pk")
    ]


@warning_check
def refunds_not_returned() -> list[str]:
    """Refunds of provider payments the provider has not given back to the payer:
    refused (the charge was never collected there), or still pending ten minutes
    after they were made (beat asks again every minute: the provider is down). The
    ledger holds the money as gone out; the payer does not have it."""
    from .models import Refund
    from .services import refunds_to_return

    refused = Refund.objects.filter(at_provider=Refund.AtProvider.REFUSED)
    return [
        f"refund {refund_id} refused by the provider"
        for refund_id in refused.order_by("pk").values_list("pk", flat=True)
    ] + [
        f"refund {refund_id} not yet returned by the provider"
        for refund_id in refunds_to_return(older_than_seconds=600)
    ]


@warning_check
def charges_not_cancelled() -> list[str]:
    """Charges opened at the provider for payments already closed (their pay
    request recorded the charge after the cancel, or after beat's re-drive failed
    the payment of an order paid or cancelled since) that the provider has not
    confirmed cancelled ten minutes later (beat asks again every minute: the
    provider is down). The payer can still pay them; the money would come back as a
    refund."""
    from .services import charges_not_cancelled as pending

    return [
        f"payment {pk} (order {no}): its charge is not yet cancelled by the provider"
        for pk, no in pending(older_than_seconds=600).values_list(
            "pk", "order__merchant_order_no"
        )
    ]


# Enough to act on; the rest are counted.
NOT_SHIPPED_NAMED = 20


@warning_check
def paid_orders_not_shipped() -> list[str]:
    """Paid orders with no shipment: nothing was sent for them. Wallet payments and
    captures made before every way of paying created the shipment left such orders;
    an operator who has checked that none was sent by hand runs
    `manage.py ship_paid_orders`."""
    from .selectors import paid_orders_without_shipment

    numbers = paid_orders_without_shipment().values_list("merchant_order_no", flat=True)
    named = list(numbers[: NOT_SHIPPED_NAMED + 1])
    warnings = [f"order {no} is paid but has no shipment" for no in named]
    if len(named) > NOT_SHIPPED_NAMED:
        more = numbers.count() - NOT_SHIPPED_NAMED
        warnings[NOT_SHIPPED_NAMED:] = [
            f"and {more} more paid orders have no shipment (manage.py ship_paid_orders)"
        ]
    return warnings


@warning_check
def charges_of_another_amount() -> list[str]:
    """Charges the provider collected for another amount than the order's: never
    kept as its payment, booked and refunded at once (`payment_settle`), named until
    the provider has given the money back to the payer. A provider charging what
    it was not asked is for an operator to take up with it."""
    from .models import Payment, Refund
    from .services import AMOUNT_MISMATCH

    # The reason alone is no proof: the refund API refuses it now
    # (`RefundReasonReserved`), but refunds made before took the customer's text.
    # A charge of another amount is a provider payment whose amount (what was
    # collected) is not its order's.
    rows = (
        Refund.objects.filter(
            reason=AMOUNT_MISMATCH, payment__method=Payment.Method.PROVIDER
        )
        .exclude(payment__amount=F("payment__order__amount"))
        .exclude(at_provider=Refund.AtProvider.RETURNED)
        .order_by("pk")
        .values_list(
            "payment_id",
            "payment__order__merchant_order_no",
            "amount",
            "payment__order__amount",
            "at_provider",
        )
    )
    return [
        f"payment {pk} (order {no}): the provider collected {amount}, not the "
        f"{asked} asked; its refund is {at_provider} at the provider"
        for pk, no, amount, asked, at_provider in rows
    ]


@warning_check
def collected_charges_booked_by_no_payment() -> list[str]:
    """Charges the provider reported collected in an answer about another charge
    than its payment's (a callback's event processed changing nothing, or the
    answer a re-drive or the reconciliation kept on its payment, `_not_its_charge`)
    that no payment has booked: the provider may hold money the ledger never
    recorded. For an operator to take up with the provider; named until a payment
    books the charge or staff record it taken up (the admin's "Taken up with the
    provider", on provider events and on payments: `charge_take_up`)."""
    from .models import ChargeTakenUp, Payment, ProviderEvent
    from .selectors import payments_heard_of_another_charge

    # Both through their partial indexes: the few answers about another charge.
    heard: dict[str, tuple[str, list[str]]] = {}
    events = (
        ProviderEvent.objects.filter(
            outcome=ProviderEvent.NOT_ITS_CHARGE, kind="SUCCESS"
        )
        .order_by("pk")
        .values_list("event_id", "payload")
    )
    for event_id, payload in events:
        txn = payload.get("provider_txn_id") or ""
        if txn:
            order_no = payload.get("merchant_order_no", "")
            heard.setdefault(txn, (order_no, []))[1].append(f"event {event_id!r}")
    answers = (
        payments_heard_of_another_charge()
        .filter(other_charge_status="SUCCESS")
        .values_list("pk", "order__merchant_order_no", "other_charge_txn_id")
    )
    for pk, order_no, txn in answers:
        heard.setdefault(txn, (order_no, []))[1].append(f"re-drive of payment {pk}")
    booked = set(
        Payment.objects.filter(
            provider_txn_id__in=list(heard), journal_entry__isnull=False
        ).values_list("provider_txn_id", flat=True)
    )
    taken_up = set(
        ChargeTakenUp.objects.filter(provider_txn_id__in=list(heard)).values_list(
            "provider_txn_id", flat=True
        )
    )
    return [
        f"provider charge {txn!r} (order {order_no}) reported collected "
        f"({', '.join(sources)}) but booked by no payment: the provider may hold "
        "money the ledger never recorded"
        for txn, (order_no, sources) in heard.items()
        if txn not in booked and txn not in taken_up
    ]
