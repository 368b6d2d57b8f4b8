"""The payment pages of the web UI: an order with its payments, and its Pay button.

They live here, above orders, because they show and make payments; the rest of the
shop's pages are `orders.views`. Every POST is answered with 303 (PRG).
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST

from idempotency.engine import Phases
from ledger.auth import authenticated
from ledger.exceptions import AccountNotActive, InsufficientFunds
from orders.exceptions import OrderAlreadyPaid, OrderNotPayable
from orders.selectors import order_get
from orders.services import order_takes_payment
from orders.views import HttpResponseSeeOther, to_order

from .exceptions import ProviderRefused, ProviderUnavailable
from .models import Payment
from .selectors import order_page_url, payment_list
from .services import payment_pay_with_balance, payment_pay_with_provider


@login_required
@require_GET
def order_detail(request: HttpRequest, merchant_order_no: str) -> HttpResponse:
    order = order_get(owner=authenticated(request), merchant_order_no=merchant_order_no)
    return render(
        request,
        "orders/order_detail.html",
        {
            "order": order,
            "payments": payment_list(order=order),
            "payable": order_takes_payment(order),
        },
    )


@login_required
@require_POST
def order_pay(request: HttpRequest, merchant_order_no: str) -> HttpResponse:
    """Pay with the wallet balance, or go to the provider's pay page. The order's
    state under a row lock, the ledger's unique reference and the one-success-per-order
    index make a second click a no-op that says so; a second click on the provider
    button continues the same pending payment (the provider dedupes by order number).
    """
    order = order_get(owner=authenticated(request), merchant_order_no=merchant_order_no)
    try:
        if request.POST.get("method") == Payment.Method.PROVIDER:
            # This view is the entry point: each step is its own durable transaction.
            steps = Phases.unrecorded()
            payment = payment_pay_with_provider(
                order_id=order.pk,
                phases=steps,
                return_url=order_page_url(request, order.merchant_order_no),
            )
            return HttpResponseSeeOther(payment.pay_url)
        with transaction.atomic(durable=True):
            payment_pay_with_balance(order_id=order.pk)
    except (ProviderUnavailable, ProviderRefused):
        messages.error(request, _("The payment provider is not answering; try again."))
    except OrderAlreadyPaid:
        messages.info(request, _("You have already paid this order."))
    except OrderNotPayable:
        messages.error(request, _("This order was cancelled; it cannot be paid."))
    except InsufficientFunds:
        messages.error(request, _("Your balance is too low to pay this order."))
    except AccountNotActive:
        messages.error(
            request,
            _("Your wallet is frozen or closed, so it cannot pay; contact support."),
        )
    else:
        messages.success(request, _("Paid. Thank you!"))
    return to_order(order.merchant_order_no)
