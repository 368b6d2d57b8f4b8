from django.contrib import admin

from .models import IdempotencyRecord, Lease


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "scope",
        "key",
        "endpoint",
        "status",
        "response_status",
        "recovery_point",
        "locked_until",
        "expires_at",
    )
    list_filter = ("status", "endpoint", "recovery_point")
    search_fields = ("key", "scope")
    exclude = ("response_body",)
    readonly_fields = [
        f.name
        for f in IdempotencyRecord._meta.fields
        if f.name not in ("id", "response_body")
    ]

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Lease)
class LeaseAdmin(admin.ModelAdmin):
    """Who holds each worker id and the beat's lead, and until when (read-only:
    only the holders write leases)."""

    list_display = ("name", "holder", "acquired_at", "expires_at")
    search_fields = ("name", "holder")
    readonly_fields = ("name", "holder", "acquired_at", "expires_at")

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
