"""The web UI: server-rendered pages, every POST answered with 303 (PRG)."""

from collections.abc import Callable
from functools import wraps
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST

from ledger.auth import authenticated
from ledger.forms import major_units
from ledger.selectors import account_postings
from ledger.services import wallet_get_or_create

from .exceptions import (
    DuplicateOrder,
    ItemsCurrencyMismatch,
    MerchantOrderNoUnknown,
    OrderAlreadyCancelled,
    OrderAmountTooLarge,
    OrderNotCancellable,
    OutOfStock,
    ProductUnknown,
)
from .fields import MAX_ORDER_LINES
from .forms import OrderForm
from .models import PreOrder
from .paging import keyset_page
from .selectors import (
    order_contents,
    order_find,
    order_get,
    order_list,
    preorder_find,
    product_list,
)
from .services import order_cancel, order_create, preorder_create


class HttpResponseSeeOther(HttpResponseRedirect):
    """Post-Redirect-Get: after a POST, tell the browser to GET the result."""

    status_code = 303


def to_order(merchant_order_no: str) -> HttpResponseSeeOther:
    return HttpResponseSeeOther(reverse("order-detail", args=[merchant_order_no]))


def login_required_back_to_order(view: Callable) -> Callable:
    """`login_required` for an order page's buttons. A button pressed after the
    session ended (it expired, or the shopper logged out in another tab, which
    leaves the CSRF token valid) did nothing: the login leads back to the order's
    page, not to the button's URL, which only takes a POST (a 405 after the login).
    """

    @wraps(view)
    def wrapped(
        request: HttpRequest, merchant_order_no: str, *args, **kwargs
    ) -> HttpResponse:
        if not request.user.is_authenticated:
            messages.warning(
                request,
                _("You were logged out, so nothing was done. Log in and try again."),
            )
            return redirect_to_login(reverse("order-detail", args=[merchant_order_no]))
        return view(request, merchant_order_no, *args, **kwargs)

    return wrapped


# What the shopper typed into the order form when its POST found them logged out
# (the session expired, or they logged out in another tab): kept in the session,
# which the login keeps, and shown on the form again once they are back, for them
# to check and send again. Nothing is ordered in between.
FORM_DRAFT_SESSION_KEY = "order_form_draft"


def login_required_keeping_the_form(view: Callable) -> Callable:
    """`login_required` for the order form. Its POST after the session ended orders
    nothing, keeps what was typed, and the login leads back to the form (by its
    token, so a form that already placed its order lands on that order again when
    sent), where the shopper finds it filled in and presses the button again."""
    guarded = login_required(view)

    @wraps(view)
    def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if request.user.is_authenticated or request.method != "POST":
            return guarded(request, *args, **kwargs)
        draft = OrderForm.draft(request.POST)
        request.session[FORM_DRAFT_SESSION_KEY] = draft
        messages.warning(
            request,
            _(
                "You were logged out, so nothing was ordered. Log in, then check "
                "the form and place the order again."
            ),
        )
        back = reverse("order-new")
        if draft.get("token", "").isdigit():
            back = f"{back}?{urlencode({'token': draft['token']})}"
        return redirect_to_login(back)

    return wrapped


def _kept_draft(request: HttpRequest) -> dict[str, str]:
    """The form the shopper typed before being logged out, once, without its token.

    Only a form whose token was issued to this shopper is theirs to see again:
    someone else who logs in on the same browser gets an empty form."""
    draft = request.session.pop(FORM_DRAFT_SESSION_KEY, None)
    if not isinstance(draft, dict):
        return {}
    token = str(draft.pop("token", ""))
    if preorder_find(owner=authenticated(request), merchant_order_no=token) is None:
        return {}
    return draft


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    return HttpResponseRedirect(reverse("order-list"))


@login_required
@require_GET
def orders_page(request: HttpRequest) -> HttpResponse:
    page = keyset_page(order_list(owner=authenticated(request)), request.GET)
    return render(
        request, "orders/order_list.html", {"orders": page.items, "page": page}
    )


# The session remembers the number issued to this visit's order form: showing the
# form again (the nav link, a reload, a second tab) reuses it, until an order is
# placed with it (seen when the form is next shown, so placing an order costs no
# session write), instead of issuing a pre-order on every visit.
FORM_TOKEN_SESSION_KEY = "order_form_token"  # noqa: S105 - a session key


def _form_preorder(request: HttpRequest) -> PreOrder:
    """This visit's unused, unexpired pre-order, or a new one remembered for it."""
    owner = authenticated(request)
    kept = preorder_find(
        owner=owner, merchant_order_no=request.session.get(FORM_TOKEN_SESSION_KEY, "")
    )
    if (
        kept is not None
        and not kept.expired
        and order_find(owner=owner, merchant_order_no=kept.merchant_order_no) is None
    ):
        return kept
    preorder = preorder_create(owner=owner)
    request.session[FORM_TOKEN_SESSION_KEY] = preorder.merchant_order_no
    return preorder


@login_required_keeping_the_form
def order_new(request: HttpRequest) -> HttpResponse:
    """Show the order form with a one-time token; create the order on POST.

    The token is a pre-order's merchant order number, issued when the form is first
    shown, so a second submission of the same form (double click, refresh, back and
    resubmit) names the same order and lands on it instead of creating another.
    """
    currency = settings.LEDGER_DEFAULT_CURRENCY
    context: dict = {"currency": currency}
    products = product_list().filter(currency=currency)[:MAX_ORDER_LINES]
    if request.method == "POST":
        # A free amount reads no products (its statements are pinned).
        chosen = OrderForm.names_quantities(request.POST)
        form = OrderForm(request.POST, products=products if chosen else ())
        if form.is_valid():
            token = form.cleaned_data["token"]
            items = form.items()
            try:
                with transaction.atomic(durable=True):  # this view is the entry point
                    if items:
                        order = order_create(
                            owner=authenticated(request),
                            merchant_order_no=token,
                            items=items,
                            description=form.cleaned_data["description"],
                        )
                    else:
                        order = order_create(
                            owner=authenticated(request),
                            merchant_order_no=token,
                            amount=form.amount_minor_units(),
                            currency=currency,
                            description=form.cleaned_data["description"],
                        )
            except DuplicateOrder:
                placed = order_find(
                    owner=authenticated(request), merchant_order_no=token
                )
                if placed is None or order_contents(placed) == form.contents(currency):
                    messages.info(
                        request, _("You already placed this order; here it is.")
                    )
                    return to_order(token)
                # This form placed another order (in a second tab, or before it was
                # changed and sent again): nothing more was ordered, and what was
                # asked for now is offered again on a new form, never dropped.
                messages.warning(
                    request,
                    _(
                        "This form already placed order %(number)s, with other "
                        "contents; nothing more was ordered. To order this too, "
                        "check it and submit it again."
                    )
                    % {"number": token},
                )
                form = OrderForm(
                    initial={
                        **form.cleaned_data,
                        "token": _form_preorder(request).merchant_order_no,
                    },
                    products=products,
                )
            except MerchantOrderNoUnknown:
                messages.warning(
                    request,
                    _("This form had expired. Please check it and submit it again."),
                )
                form = OrderForm(
                    initial={
                        **form.cleaned_data,
                        "token": _form_preorder(request).merchant_order_no,
                    },
                    products=products,
                )
            except OutOfStock as exc:
                # Nothing was taken and the token is still unused: same form again.
                form.add_error(
                    None,
                    _("Not enough %(sku)s left; nothing was ordered.")
                    % {"sku": exc.extra["sku"]},
                )
            except OrderAmountTooLarge:
                form.add_error(
                    None,
                    _("This order would cost more than one order may; order fewer."),
                )
            except (ProductUnknown, ItemsCurrencyMismatch):
                form.add_error(None, _("These products cannot be ordered together."))
            else:
                messages.success(request, _("Order placed."))
                return to_order(order.merchant_order_no)
        elif "token" in form.errors:
            # A mangled token cannot name any order: show the form with a fresh one.
            data = request.POST.copy()
            data["token"] = _form_preorder(request).merchant_order_no
            form = OrderForm(data, products=products)
            form.is_valid()
    elif request.method == "GET":
        token = request.GET.get("token", "")
        preorder = preorder_find(owner=authenticated(request), merchant_order_no=token)
        placed = order_find(owner=authenticated(request), merchant_order_no=token)
        if preorder is None or (placed is None and preorder.expired):
            # Issue the token (once per visit), then show the form at a URL that
            # names it: going back to this page, even when the browser fetches it
            # again, shows the same token, and resubmitting it lands on the same
            # order.
            preorder = _form_preorder(request)
            query = urlencode({"token": preorder.merchant_order_no})
            return HttpResponseRedirect(f"{reverse('order-new')}?{query}")
        initial: dict[str, object] = {"token": preorder.merchant_order_no}
        draft = _kept_draft(request)
        if draft:
            initial.update(draft)
            messages.info(
                request,
                _(
                    "Here is the form as you left it; nothing was ordered yet. "
                    "Check it and place the order."
                ),
            )
        elif placed is not None:
            lines = {line.product_id: line.quantity for line in placed.items.all()}
            if lines:
                initial.update(
                    {OrderForm.quantity_field(p): lines.get(p.pk) for p in products}
                )
            else:
                initial["amount"] = major_units(placed.amount)
            initial["description"] = placed.description
        form = OrderForm(initial=initial, products=products)
        context["placed"] = placed
    else:
        return HttpResponse(status=405, headers={"Allow": "GET, POST"})
    if not form.products:
        form = form.showing(products)
    response = render(request, "orders/order_new.html", {**context, "form": form})
    # Never `no-store`: a browser may then keep the page (and what was typed into it)
    # for the back button.
    response["Cache-Control"] = "private"
    return response


@login_required_back_to_order
@require_POST
def order_cancel_view(request: HttpRequest, merchant_order_no: str) -> HttpResponse:
    order = order_get(owner=authenticated(request), merchant_order_no=merchant_order_no)
    try:
        with transaction.atomic(durable=True):
            order_cancel(order_id=order.pk)
    except OrderAlreadyCancelled:
        messages.info(request, _("This order is already cancelled."))
    except OrderNotCancellable:
        messages.error(request, _("Only an unpaid order can be cancelled."))
    else:
        messages.success(request, _("Order cancelled."))
    return to_order(order.merchant_order_no)


@login_required
@require_GET
def account(request: HttpRequest) -> HttpResponse:
    wallet = wallet_get_or_create(
        owner_id=authenticated(request).pk,
        currency=settings.LEDGER_DEFAULT_CURRENCY,
    )
    page = keyset_page(account_postings(account=wallet), request.GET)
    return render(
        request,
        "account.html",
        {"wallet": wallet, "postings": page.items, "page": page},
    )
