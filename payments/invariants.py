"""The payments app's addition to `check_ledger`: no order is paid twice."""

from django.db.models import Count, Q

from ledger.invariants import invariant


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
