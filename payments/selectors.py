from django.db.models import QuerySet

from orders.models import Order

from .models import Payment


def payment_list(*, order: Order) -> QuerySet[Payment]:
    """The order's payments, newest first."""
    return Payment.objects.filter(order=order).order_by("-id")
