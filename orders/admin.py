from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ledger.backoffice import money_column
from ledger.exceptions import DomainError

from . import services
from .models import Order, PreOrder

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
    list_filter = ("status", "currency", "created_at")
    search_fields = ("merchant_order_no", "owner__username", "description")
    list_select_related = ("owner",)
    date_hierarchy = "created_at"
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
    actions = ("cancel", "ship", "complete")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    amount_money = money_column("amount", _("amount"))

    @admin.display(description=_("available transitions"))
    def available_transitions(self, order: Order) -> str:
        transitions = order.get_available_status_transitions()  # type: ignore[attr-defined]  # added by django-fsm
        names = sorted(t.name for t in transitions)
        return ", ".join(str(TRANSITION_LABELS.get(n, n)) for n in names) or "—"

    def _transition(self, request: HttpRequest, queryset: QuerySet, service) -> None:
        moved = 0
        for order in queryset.order_by("pk"):
            try:
                with transaction.atomic(durable=True):  # one order, one transaction
                    service(order_id=order.pk)
            except DomainError as exc:
                self.message_user(request, exc.detail, messages.WARNING)
            else:
                moved += 1
        if moved:
            self.message_user(
                request,
                ngettext("%(count)d order updated.", "%(count)d orders updated.", moved)
                % {"count": moved},
                messages.SUCCESS,
            )

    @admin.action(description=_("Cancel (only unpaid orders)"))
    def cancel(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._transition(request, queryset, services.order_cancel)

    @admin.action(description=_("Mark shipped (paid orders)"))
    def ship(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._transition(request, queryset, services.order_ship)

    @admin.action(description=_("Mark completed (shipped orders)"))
    def complete(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._transition(request, queryset, services.order_complete)


@admin.register(PreOrder)
class PreOrderAdmin(admin.ModelAdmin):
    list_display = ("merchant_order_no", "owner", "created_at", "expires_at")
    search_fields = ("merchant_order_no", "owner__username")
    date_hierarchy = "created_at"
    readonly_fields = ("merchant_order_no", "owner", "created_at", "expires_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False
