from django.contrib import admin
from django.http import HttpRequest

from .models import Payment, ProviderEvent, Refund, Shipment


@admin.register(Payment)
class PaymentAdmin(admin.ModelAdmin):
    """Payments are records of money that moved: read-only here; refunds go through
    their service so the ledger moves with them."""

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
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(Refund)
class RefundAdmin(admin.ModelAdmin):
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

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


class _ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(ProviderEvent)
class ProviderEventAdmin(_ReadOnly):
    """The inbox of provider callbacks, as received."""

    list_display = ("event_id", "payment", "kind", "status", "outcome", "received_at")
    list_filter = ("status", "kind")
    search_fields = ("event_id", "payment__order__merchant_order_no")


@admin.register(Shipment)
class ShipmentAdmin(_ReadOnly):
    list_display = ("order", "status", "created_at", "dispatched_at")
    list_filter = ("status",)
