from django.contrib import admin
from django.http import HttpRequest

from .models import Payment, Refund


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
