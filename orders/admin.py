from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.translation import gettext, ngettext, pgettext_lazy
from django.utils.translation import gettext_lazy as _

from ledger.backoffice import (
    ActionForm,
    CurrencyFilter,
    HttpResponseSeeOther,
    money_column,
    one_time_token,
    token_issued,
)
from ledger.currencies import SUPPORTED_CURRENCIES
from ledger.exceptions import DomainError
from ledger.forms import MoneyField, PlainIntegerField, major_units, minor_units

from . import services
from .exceptions import OutOfStock
from .fields import MAX_AMOUNT, MAX_STOCK_MOVE
from .models import Order, OrderItem, PreOrder, Product, StockMovement
from .selectors import stock_adjustment_matches


class OrderItemInline(admin.TabularInline):
    model = OrderItem
    fields = ("sku", "name", "quantity", "price_money")
    readonly_fields = fields
    price_money = money_column(
        "price", _("unit price"), currency=lambda item: item.order.currency
    )
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


# The state machine's edges as staff read them (django-fsm knows only their names).
TRANSITION_LABELS = {
    "pay": _("pay"),
    "ship": _("ship"),
    "complete": _("complete"),
    "cancel": _("cancel"),
    "refund": _("refund"),
    "authorize": _("authorize"),
    "capture": _("capture"),
    "void": _("void"),
}
# What an order would be after each of the admin's actions, for a refusal ("it
# cannot be shipped"): the edge's name, a verb, reads as something else.
TRANSITION_DONE_LABELS = {
    "cancel": pgettext_lazy("order refusal", "cancelled"),
    "ship": pgettext_lazy("order refusal", "shipped"),
    "complete": pgettext_lazy("order refusal", "completed"),
}


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    """Orders change state only through their transitions (the actions below), each
    one a service call with the same guards as the API."""

    list_display = (
        "merchant_order_no",
        "amount_money",
        "status",
        "owner",
        "available_transitions",
        "created_at",
    )
    # No date hierarchy: it reads every order's day (`SELECT DISTINCT`) on each page.
    list_filter = ("status", CurrencyFilter, "created_at")
    search_fields = ("merchant_order_no", "owner__username", "description")
    list_select_related = ("owner",)
    readonly_fields = (
        "merchant_order_no",
        "owner",
        "amount_money",
        "currency",
        "description",
        "status",
        "available_transitions",
        "created_at",
        "updated_at",
        "paid_at",
    )
    fields = readonly_fields
    inlines = (OrderItemInline,)
    actions = ("cancel", "ship", "complete")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        # Nothing of an order is edited by hand: a Save would write back the row the
        # page read, racing the payment that moves it (the state machine refused
        # that with a 500). The actions are the way to change one.
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    amount_money = money_column("amount", _("amount"))

    @admin.display(description=_("available transitions"))
    def available_transitions(self, order: Order) -> str:
        transitions = order.get_available_status_transitions()  # type: ignore[attr-defined]  # added by django-fsm
        names = sorted(t.name for t in transitions)
        return ", ".join(str(TRANSITION_LABELS.get(n, n)) for n in names) or "—"

    def _transition(
        self, request: HttpRequest, queryset: QuerySet, service, name: str
    ) -> None:
        moved = 0
        for order in queryset.order_by("pk"):
            try:
                with transaction.atomic(durable=True):  # one order, one transaction
                    service(order_id=order.pk)
            except DomainError:
                # The refusal's detail is the API's English: say it in the reader's
                # language, with the status the order has now.
                order.refresh_from_db(fields=["status"])
                self.message_user(
                    request,
                    gettext(
                        "Order %(order)s is %(status)s; it cannot be %(done)s. "
                        "Not changed."
                    )
                    % {
                        "order": order.merchant_order_no,
                        "status": order.get_status_display(),
                        "done": TRANSITION_DONE_LABELS[name],
                    },
                    messages.WARNING,
                )
            else:
                moved += 1
        if moved:
            self.message_user(
                request,
                ngettext("%(count)d order updated.", "%(count)d orders updated.", moved)
                % {"count": moved},
                messages.SUCCESS,
            )

    # Who may press what: each action changes the order (a cancel of an authorized
    # one releases its hold), so it needs "change order", which the page's Save,
    # refused to everyone above, does not grant. Staff who may only look at orders
    # are offered none of them, and a POST of one finds no such action.
    def has_transition_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("orders.change_order")

    has_cancel_permission = has_transition_permission
    has_ship_permission = has_transition_permission
    has_complete_permission = has_transition_permission

    @admin.action(description=_("Cancel (only unpaid orders)"), permissions=["cancel"])
    def cancel(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._transition(request, queryset, services.order_cancel, "cancel")

    @admin.action(description=_("Mark shipped (paid orders)"), permissions=["ship"])
    def ship(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._transition(request, queryset, services.order_ship, "ship")

    @admin.action(
        description=_("Mark completed (shipped orders)"), permissions=["complete"]
    )
    def complete(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._transition(request, queryset, services.order_complete, "complete")


@admin.register(PreOrder)
class PreOrderAdmin(admin.ModelAdmin):
    """Read-only. A pre-order is the memory that its number was issued, and of the
    order placed with it: deleted, the web form's resubmission of that number would
    place the order a second time. Only the purge task deletes pre-orders, and only
    unused, expired ones."""

    list_display = ("merchant_order_no", "owner", "created_at", "expires_at")
    # No date hierarchy: it reads every pre-order's day (`SELECT DISTINCT`) on each
    # page.
    list_filter = ("created_at",)
    search_fields = ("merchant_order_no", "owner__username")
    readonly_fields = ("merchant_order_no", "owner", "created_at", "expires_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


def _staff_note(request: HttpRequest, note: str) -> str:
    """Who adjusted the stock, and why, as the movement's note: a username may be
    150 characters and the reason 200, so the username gives way first."""
    room = StockMovement._meta.get_field("note").max_length or 255
    who = request.user.get_username()[: max(0, room - len(note) - 2)]
    return f"{who}: {note}"[:room]


class StockAdjustForm(ActionForm):
    # Its one-time token, made when the form is first shown and kept in the page's
    # address, becomes the movement's reference, so a second click (or the page
    # resubmitted, after Back too) moves nothing.
    quantity = PlainIntegerField(
        label=_("Units to add (negative to remove)"),
        min_value=-MAX_STOCK_MOVE,
        max_value=MAX_STOCK_MOVE,
    )
    note = forms.CharField(label=_("Why"), max_length=200)

    def clean_quantity(self) -> int:
        quantity = self.cleaned_data["quantity"]
        if quantity == 0:
            raise forms.ValidationError(_("Enter a number of units other than 0."))
        return quantity


class ProductForm(forms.ModelForm):
    # Staff type a price as the shop shows it (12.50), not in minor units.
    price = MoneyField(label=_("price"), max_minor=MAX_AMOUNT)
    currency = forms.ChoiceField(
        label=_("currency"), choices=[(code, code) for code in SUPPORTED_CURRENCIES]
    )

    class Meta:
        model = Product
        fields = ("sku", "name", "price", "currency")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.initial["price"] = major_units(self.instance.price)

    def clean_price(self) -> int:
        return minor_units(self.cleaned_data["price"])


@admin.register(Product)
class ProductAdmin(admin.ModelAdmin):
    """Products with their stock. The stock is read-only here: it changes only
    through stock movements (the "Adjust stock" page, orders, their cancellations)."""

    form = ProductForm
    list_display = ("sku", "name", "price_money", "currency", "stock", "updated_at")
    list_filter = (CurrencyFilter,)
    search_fields = ("sku", "name")
    readonly_fields = ("stock", "adjust_stock", "created_at", "updated_at")
    price_money = money_column("price", _("price"))

    def get_readonly_fields(self, request: HttpRequest, obj=None) -> tuple:
        if obj is None:
            return ("stock",)
        # The SKU names the product in orders and movements: fixed once made.
        fields: tuple[str, ...] = ("sku", *self.readonly_fields)
        if not self.has_change_permission(request, obj):
            # Staff who may only look are offered no button that would refuse them.
            fields = tuple(f for f in fields if f != "adjust_stock")
        return fields

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False  # its movements and order lines keep naming it

    def save_model(
        self, request: HttpRequest, obj: Product, form: forms.ModelForm, change: bool
    ) -> None:
        if not change:
            super().save_model(request, obj, form, change)
        elif form.changed_data:
            # Only what the form edits: a whole-row save would write back the stock
            # this page read, undoing the orders taken since.
            obj.save(update_fields=[*form.changed_data, "updated_at"])

    @admin.display(description=_("adjust stock"))
    def adjust_stock(self, product: Product) -> str:
        url = reverse("admin:orders_product_adjust_stock", args=[product.pk])
        return format_html('<a class="button" href="{}">{}</a>', url, _("Adjust stock"))

    def get_urls(self) -> list[URLPattern]:
        adjust = path(
            "<int:product_id>/adjust-stock/",
            self.admin_site.admin_view(self.adjust_stock_view),
            name="orders_product_adjust_stock",
        )
        return [adjust, *super().get_urls()]

    def adjust_stock_view(self, request: HttpRequest, product_id: int) -> HttpResponse:
        """Add or remove units through `stock_adjust`, once per shown form.

        As the back office's action pages (`ledger.backoffice`): the product page's
        button leads here without a token, which answers 303 to this page's address
        with a fresh one (`?token=...`); the page shows the token its address names,
        so reloading it or coming back to it with Back shows the same form, and
        submitting it again is the same adjustment, made once."""
        product = get_object_or_404(Product, pk=product_id)
        if not self.has_change_permission(request, product):
            raise PermissionDenied  # the back office's 403 page, which says why
        change_url = reverse("admin:orders_product_change", args=[product.pk])
        if request.method == "POST":
            form = StockAdjustForm(request.POST)
            if form.is_valid():
                data = form.cleaned_data
                reference = f"{product.pk}:{data['token']}"
                note = _staff_note(request, data["note"])
                try:
                    # The view is the entry point: it owns the transaction.
                    with transaction.atomic(durable=True):
                        moved = services.stock_adjust(
                            product_id=product.pk,
                            quantity=data["quantity"],
                            reference=reference,
                            note=note,
                        )
                except OutOfStock:
                    product.refresh_from_db(fields=["stock"])
                    form.add_error(
                        "quantity",
                        gettext(
                            "Only %(stock)s in stock: %(quantity)s cannot be "
                            "removed. Nothing changed."
                        )
                        % {"stock": product.stock, "quantity": -data["quantity"]},
                    )
                else:
                    if moved:
                        self.message_user(
                            request, _("Stock adjusted."), messages.SUCCESS
                        )
                    elif stock_adjustment_matches(
                        reference=reference, quantity=data["quantity"], note=note
                    ):
                        self.message_user(
                            request,
                            _("This adjustment was already made; nothing changed."),
                            messages.WARNING,
                        )
                    else:
                        # Back, other values, submit: the token is spent on the
                        # adjustment it made; this one was not made.
                        self.message_user(
                            request,
                            _(
                                "This form already made another adjustment; nothing "
                                "more changed. Open the page again to make this one."
                            ),
                            messages.WARNING,
                        )
                    return HttpResponseRedirect(change_url)
        else:
            token = request.GET.get("token", "")
            if not token_issued(token):  # none yet, or one the server never issued
                query = urlencode({"token": one_time_token()})
                return HttpResponseSeeOther(f"{request.path}?{query}")
            form = StockAdjustForm(initial={"token": token})
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "product": product,
            "form": form,
            "change_url": change_url,
            "title": _("Adjust stock"),
        }
        template = "admin/orders/product/adjust_stock.html"
        # Refused input answers 400, as every back-office form that takes input.
        status = 400 if form.is_bound else 200
        # (Served no-store, as every admin view: Back asks for the page again, at the
        # address that names its token.)
        return TemplateResponse(request, template, context, status=status)


@admin.register(StockMovement)
class StockMovementAdmin(admin.ModelAdmin):
    """The journal of goods: read-only (append-only in the database too)."""

    list_display = ("created_at", "product", "quantity", "kind", "reference", "note")
    # No date hierarchy: it reads every movement's day (`SELECT DISTINCT`) on each
    # page.
    list_filter = ("kind", "created_at")
    search_fields = ("reference", "product__sku", "note")
    list_select_related = ("product",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False
