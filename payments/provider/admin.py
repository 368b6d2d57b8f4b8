from django.contrib import admin

from .models import Charge, Notification


@admin.register(Charge)
class ChargeAdmin(admin.ModelAdmin):
    list_display = ("txn_id", "merchant_order_no", "amount", "currency", "status")
    list_filter = ("status",)
    search_fields = ("txn_id", "merchant_order_no")


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = ("event_id", "attempts", "last_status", "delivered_at")
