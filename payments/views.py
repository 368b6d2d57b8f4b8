"""The payment pages of the web UI: an order with its payments, its Pay and Refund
buttons, the live part of the order page, the payment history and receipts.

They live here, above orders, because they show and make payments; the rest of the
shop's pages are `orders.views`. Every POST is answered with 303 (PRG).
"""

import re
import secrets

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import BadRequest
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST

from idempotency.calls import idempotent_call
from idempotency.engine import Phases
from idempotency.exceptions import IdempotencyKeyInFlight, IdempotencyKeyReused
from ledger.auth import authenticated
from ledger.exceptions import AccountNotActive, DomainError, InsufficientFunds
from ledger.forms import row_id
from orders.exceptions import OrderAlreadyPaid, OrderAuthorized, OrderNotPayable
from orders.models import REFUNDABLE_STATES, Order
from orders.paging import keyset_page
from orders.selectors import order_get
from orders.services import order_takes_payment
from orders.views import (
    HttpResponseSeeOther,
    login_required_back_to_order,
    to_order,
)

from .exceptions import (
    AlreadyRefunded,
    ProviderChargeUsed,
    ProviderRefused,
    ProviderUnavailable,
)
from .models import Payment
from .selectors import order_page_url, payment_get, payment_history, payment_list
from .services import (
    payment_pay_with_balance,
    payment_pay_with_provider,
    payment_refund,
)

# The header the live part of the order page carries its state in: the poll swaps
# the part in only when it changed, and stops once nothing is pending.
LIVE_STATE_HEADER = "X-Order-State"
# A one-time form token: issued with the page, the idempotency key of what the form
# asks for (see `order_refund`).
FORM_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,64}")


def new_form_token() -> str:
    return secrets.token_urlsafe(18)


def user_scope(request: HttpRequest) -> str:
    """The idempotency scope of the user, the same as the API's: a key is the
    user's, whichever door it came in by."""
    return f"user:{authenticated(request).pk}"


# How the latest payment ended, as the note the live part shows once the poll sees
# it settle: what became of the shopper's money, not only of the payment.
OUTCOME_LEVELS = {"paid": "success", "refunded": "info", "late_refunded": "info"}


def _outcome(order: Order, latest: Payment | None) -> str:
    """Name the end the order's latest payment came to, for the settled note."""
    if latest is None:
        return ""
    if order.status == Order.Status.REFUNDED:
        return "refunded"  # paid, then given back
    if order.is_paid:
        return "paid"
    if latest.status == Payment.Status.REFUNDED:
        if latest.amount != order.amount:
            # The provider collected another amount than the order's (the
            # payment's amount is what it collected): given back at once, the
            # order left as it was (`payment_settle`).
            return "another_amount"
        # Its success came when the order no longer took money (cancelled as the
        # payer confirmed): `payment_settle` refunded it at once.
        return "late_refunded"
    if latest.status == Payment.Status.FAILED:
        return "declined"
    if order.status == Order.Status.CANCELLED:
        return "cancelled"
    return "not_taken"


def _order_context(order: Order) -> dict:
    """What the order page and its live part show: the order, its payments, what
    the shopper may do now, and a state the page's poll compares."""
    payments = list(payment_list(order=order))
    payable = order_takes_payment(order)
    pending = [p for p in payments if p.status == Payment.Status.PENDING]
    # The provider payment to continue on its pay page, while the order takes money.
    open_provider = next(
        (p for p in pending if p.method == Payment.Method.PROVIDER and p.pay_url),
        None,
    )
    refundable = None
    if order.status in REFUNDABLE_STATES:
        refundable = next(
            (p for p in payments if p.status == Payment.Status.SUCCEEDED), None
        )
    latest = payments[0] if payments else None
    # A cancelled order's provider payment still open may yet settle: the payer
    # confirmed it as the cancel came (the success is then refunded), or its charge
    # is being cancelled at the provider. Follow it to its end, so that the note
    # says which, instead of stopping at the cancel.
    settling = order.status == Order.Status.CANCELLED and open_provider is not None
    outcome = _outcome(order, latest)
    return {
        "order": order,
        "payments": payments,
        "payable": payable,
        "open_provider": open_provider if payable else None,
        # The provider's one charge for the order was collected and given back
        # (as `provider_charge_used` reads it, from the payments at hand).
        "provider_used": payable and any(p.used_provider_charge for p in payments),
        # Follow the page while a payment may still settle by itself: one with a
        # pay page. A pending payment the provider never answered for has none, so
        # nothing can settle it; the shopper presses the button again.
        "following": (payable or settling) and open_provider is not None,
        "settling": settling,
        "refundable": refundable,
        "refund_token": new_form_token() if refundable else "",
        "latest": latest,
        "outcome": outcome,
        "outcome_level": OUTCOME_LEVELS.get(outcome, "warning"),
        "state": ";".join(
            [str(order.status), *(f"{p.pk}:{p.status}" for p in payments)]
        ),
    }


@login_required
@require_GET
def order_detail(request: HttpRequest, merchant_order_no: str) -> HttpResponse:
    order = order_get(owner=authenticated(request), merchant_order_no=merchant_order_no)
    return render(request, "orders/order_detail.html", _order_context(order))


@login_required
@require_GET
def order_live(request: HttpRequest, merchant_order_no: str) -> HttpResponse:
    """The live part of the order page, which the page polls every second or two
    while a payment is pending and swaps in when its state changed."""
    order = order_get(owner=authenticated(request), merchant_order_no=merchant_order_no)
    context = _order_context(order)
    response = render(request, "orders/_order_live.html", context)
    response[LIVE_STATE_HEADER] = context["state"]
    response["Cache-Control"] = "no-store"
    return response


@login_required_back_to_order
@require_POST
def order_pay(request: HttpRequest, merchant_order_no: str) -> HttpResponse:
    """Pay with the wallet balance, or go to the provider's pay page. The order's
    state under a row lock, the ledger's unique reference and the one-success-per-order
    index make a second click a no-op that says so; a second click on the provider
    button continues the same pending payment (the provider dedupes by order number).
    """
    order = order_get(owner=authenticated(request), merchant_order_no=merchant_order_no)
    method = request.POST.get("method") or Payment.Method.BALANCE
    if method not in (Payment.Method.BALANCE, Payment.Method.PROVIDER):
        raise BadRequest("unknown payment method")  # only a crafted form sends one
    try:
        if method == Payment.Method.PROVIDER:
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
    except ProviderChargeUsed:
        messages.error(
            request,
            _(
                "The payment provider has already taken and given back a payment "
                "for this order, and takes no other; pay it with your balance."
            ),
        )
    except OrderAlreadyPaid:
        messages.info(request, _("You have already paid this order."))
    except OrderAuthorized:
        messages.info(
            request,
            _(
                "This order is already authorized: its amount is held on your wallet "
                "until the shop captures it, so nothing more was charged."
            ),
        )
    except OrderNotPayable:
        messages.error(request, _("This order was cancelled; it cannot be paid."))
    except InsufficientFunds as exc:
        held, balance = exc.extra.get("held", 0), exc.extra.get("balance", 0)
        if held and balance >= exc.extra.get("amount", 0):
            # The balance the account page shows would do: holds take the rest.
            messages.error(
                request,
                _(
                    "Part of your balance is held by authorized payments; what is "
                    "left is too low to pay this order."
                ),
            )
        else:
            messages.error(request, _("Your balance is too low to pay this order."))
    except AccountNotActive:
        messages.error(
            request,
            _("Your wallet is frozen or closed, so it cannot pay; contact support."),
        )
    else:
        messages.success(request, _("Paid. Thank you!"))
    return to_order(order.merchant_order_no)


@login_required_back_to_order
@require_POST
def order_refund(request: HttpRequest, merchant_order_no: str) -> HttpResponse:
    """Refund the order's payment: `payment_refund`, the API's service, under the
    API's idempotency engine, keyed by the form's one-time token.

    The token is issued with the page. The same form sent again (a double click, a
    refresh, a second request racing the first) is the same key: the stored outcome
    is replayed, or the call waits for the first one to finish. Another form (a
    second tab, a stale page) is another key, and `payment_refund` itself refuses a
    second refund under the order's and the payment's row locks: one refund, however
    often it is asked for.
    """
    order = order_get(owner=authenticated(request), merchant_order_no=merchant_order_no)
    token = request.POST.get("token", "")
    payment_id = row_id(request.POST.get("payment"))
    if not FORM_TOKEN.fullmatch(token) or payment_id is None:
        messages.error(request, _("This form was not valid; please try again."))
        return to_order(order.merchant_order_no)
    payment = payment_get(owner=authenticated(request), payment_id=payment_id)
    if payment.order_id != order.pk:
        raise Http404("no such payment on this order")
    try:
        idempotent_call(
            user_scope(request),
            f"web-refund:{token}",
            lambda: {"refund": payment_refund(payment_id=payment.pk).pk},
            request={"payment": payment.pk},
        )
    except AlreadyRefunded:
        messages.info(request, _("This payment was already refunded."))
    except IdempotencyKeyInFlight:
        messages.info(
            request, _("Your refund is still being made; this page will show it.")
        )
    except IdempotencyKeyReused:
        messages.error(request, _("This form was not valid; please try again."))
    except DomainError:
        messages.error(request, _("This payment cannot be refunded."))
    else:
        if payment.method == Payment.Method.BALANCE:
            messages.success(request, _("Refunded: the money is back in your wallet."))
        else:
            messages.success(
                request,
                _("Refunded: the money goes back through the payment provider."),
            )
    return to_order(order.merchant_order_no)


@login_required
@require_GET
def payment_history_page(request: HttpRequest) -> HttpResponse:
    page = keyset_page(payment_history(owner=authenticated(request)), request.GET)
    return render(
        request, "payments/payment_list.html", {"payments": page.items, "page": page}
    )


@login_required
@require_GET
def payment_receipt(request: HttpRequest, payment_id: int) -> HttpResponse:
    payment = payment_get(owner=authenticated(request), payment_id=payment_id)
    refund = getattr(payment, "refund_record", None)
    return render(
        request, "payments/payment_receipt.html", {"payment": payment, "refund": refund}
    )
