from collections.abc import Callable

from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest

from ledger.admin import ReadOnlyAdmin
from ledger.exceptions import DomainError
from orders.admin import OrderAdmin
from orders.models import Order

from .models import Payment, ProviderEvent, Refund, Shipment
from .services import payment_capture, payment_void, provider_event_redrive


class PaymentInline(admin.TabularInline):
    model = Payment
    fields = ("id", "method", "amount", "currency", "status", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


# An order's page in the admin lists its payments: orders know nothing of payments, so
# the inline is added here, on top.
admin.site.unregister(Order)


@admin.register(Order)
class OrderWithPaymentsAdmin(OrderAdmin):
    inlines = (PaymentInline,)


@admin.register(Payment)
class PaymentAdmin(ReadOnlyAdmin):
    """Payments are records of money that moved: read-only here; refunds go through
    their service so the ledger moves with them. An authorized payment (manual
    capture) can be captured in full or voided: each action calls the same service
    as the API, once per payment per click, in its own transaction; a payment no
    longer authorized (a second click, a race with the expiry) is skipped."""

    list_display = (
        "id",
        "order",
        "method",
        "amount",
        "currency",
        "status",
        "created_at",
        "succeeded_at",
    )
    list_filter = ("status", "method", "currency")
    search_fields = ("order__merchant_order_no", "order__owner__username")
    list_select_related = ("order",)
    date_hierarchy = "created_at"
    readonly_fields = (
        "order",
        "method",
        "amount",
        "currency",
        "status",
        "journal_entry",
        "created_at",
        "updated_at",
        "succeeded_at",
        "provider_txn_id",
        "pay_url",
        "authorized_amount",
        "hold",
    )
    actions = ("capture", "void")

    def has_capture_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("payments.change_payment")

    has_void_permission = has_capture_permission

    @admin.action(
        description="Capture authorized payments (in full)", permissions=["capture"]
    )
    def capture(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._each(request, queryset, payment_capture, "captured")

    @admin.action(
        description="Void authorized payments (release the hold)",
        permissions=["void"],
    )
    def void(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._each(request, queryset, payment_void, "voided")

    def _each(
        self,
        request: HttpRequest,
        queryset: QuerySet,
        service: Callable[..., object],
        done: str,
    ) -> None:
        outcomes = {done: 0, "skipped": 0}
        for pk in queryset.order_by("pk").values_list("pk", flat=True):
            try:
                with transaction.atomic(durable=True):  # the admin is the entry point
                    service(payment_id=pk)
            except DomainError as exc:
                outcomes["skipped"] += 1
                self.message_user(
                    request, f"Payment {pk}: {exc.detail}", messages.WARNING
                )
            else:
                outcomes[done] += 1
        summary = ", ".join(f"{n} {outcome}" for outcome, n in outcomes.items())
        self.message_user(request, f"{summary}.", messages.INFO)


@admin.register(Refund)
class RefundAdmin(ReadOnlyAdmin):
    """Refunds are made by `payment_refund` (money moves with them): read-only."""

    list_display = ("id", "payment", "amount", "currency", "reason", "created_at")
    list_filter = ("currency", "reason")
    search_fields = ("payment__order__merchant_order_no",)
    readonly_fields = (
        "payment",
        "amount",
        "currency",
        "reason",
        "journal_entry",
        "created_at",
    )


@admin.register(ProviderEvent)
class ProviderEventAdmin(ReadOnlyAdmin):
    """The inbox of provider callbacks, as received. Filter by status `parked` for
    the ones that failed PROVIDER_EVENT_MAX_ATTEMPTS times; once the cause is fixed,
    the "re-drive" action processes them again, once."""

    list_display = (
        "event_id",
        "payment",
        "kind",
        "status",
        "outcome",
        "attempts",
        "last_error",
        "received_at",
        "parked_at",
    )
    list_filter = ("status", "kind")
    search_fields = ("event_id", "payment__order__merchant_order_no")
    actions = ("redrive",)

    def has_redrive_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("payments.change_providerevent")

    @admin.action(
        description="Re-drive parked events (process them again, once)",
        permissions=["redrive"],
    )
    def redrive(self, request: HttpRequest, queryset: QuerySet) -> None:
        outcomes: dict[str, int] = {}
        for pk in queryset.order_by("pk").values_list("pk", flat=True):
            event, redriven = provider_event_redrive(event_id=pk)
            if not redriven:
                outcome = "skipped (not parked)"
            elif event.status == ProviderEvent.Status.PROCESSED:
                outcome = "processed"
            else:
                outcome = "failed again"
                self.message_user(
                    request,
                    f"Event {event.event_id} failed again: {event.last_error}",
                    messages.WARNING,
                )
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        summary = ", ".join(f"{n} {outcome}" for outcome, n in outcomes.items())
        self.message_user(request, f"Re-drive: {summary}.", messages.INFO)


@admin.register(Shipment)
class ShipmentAdmin(ReadOnlyAdmin):
    list_display = ("order", "status", "created_at", "dispatched_at")
    list_filter = ("status",)
