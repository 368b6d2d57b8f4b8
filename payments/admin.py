from django.contrib import admin

from ledger.admin import ReadOnlyAdmin

from .models import Payment, ProviderEvent, Refund, Shipment


@admin.register(Payment)
class PaymentAdmin(ReadOnlyAdmin):
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
    """The inbox of provider callbacks, as received."""

    list_display = ("event_id", "payment", "kind", "status", "outcome", "received_at")
    list_filter = ("status", "kind")
    search_fields = ("event_id", "payment__order__merchant_order_no")


@admin.register(Shipment)
class ShipmentAdmin(ReadOnlyAdmin):
    list_display = ("order", "status", "created_at", "dispatched_at")
    list_filter = ("status",)
