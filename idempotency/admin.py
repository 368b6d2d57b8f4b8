from django.contrib import admin

from .models import IdempotencyRecord


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
