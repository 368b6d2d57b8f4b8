from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from ledger.admin import ReadOnlyAdmin
from ledger.backoffice import money_column

from .models import Charge, Notification


@admin.register(Charge)
class ChargeAdmin(ReadOnlyAdmin):
    """The simulator's own records: they change only through its pay page and its
    API, like a real provider's."""

    list_display = ("txn_id", "merchant_order_no", "amount_money", "status")
    list_filter = ("status",)
    search_fields = ("txn_id", "merchant_order_no")
    amount_money = money_column("amount", _("amount"))
    readonly_fields = (
        "txn_id",
        "merchant_order_no",
        "amount_money",
        "currency",
        "description",
        "status",
        "created_at",
        "settled_at",
    )
    fields = readonly_fields


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    list_display = ("event_id", "attempts", "last_status", "delivered_at")
