from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import Http404
from django.shortcuts import get_object_or_404

from orders.models import Order

from .models import Payment


def payment_list(*, order: Order) -> QuerySet[Payment]:
    """The order's payments, newest first."""
    return Payment.objects.filter(order=order).order_by("-id")


def payment_get(*, owner: User, payment_id: int) -> Payment:
    """The owner's payment; 404 for anyone else's or an unknown one."""
    if not 0 < payment_id < 2**63:
        raise Http404("no such payment")
    payments = Payment.objects.select_related("hold")
    return get_object_or_404(payments, pk=payment_id, order__owner=owner)
