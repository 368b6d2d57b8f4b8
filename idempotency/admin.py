from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from .decorators import ENDPOINTS
from .listfilters import ValuesFilter
from .models import STARTED, AuditEntry, IdempotencyRecord, Lease
from .services import KeyNotForgettable, record_forget


class EndpointFilter(ValuesFilter):
    """The endpoints declared with `@idempotent` (a call from code records its scope
    as its endpoint: search for it)."""

    title = _("endpoint")
    parameter_name = field = "endpoint"

    def values(self) -> list[tuple[str, str]]:
        return [(name, name) for name in sorted(ENDPOINTS)]


class ForgettableFilter(admin.SimpleListFilter):
    """The keys "forget" may free: still processing at their first recovery point,
    read through the in-flight partial index. (A filter on the recovery point itself
    would offer every phase name ever written, found by reading the whole table.)"""

    title = _("before its first recovery point")
    parameter_name = "forgettable"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list:
        return [("yes", _("Yes"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "yes":
            return queryset.filter(
                status=IdempotencyRecord.Status.PROCESSING, recovery_point=STARTED
            )
        return queryset


class ReadOnlyAdmin(admin.ModelAdmin):
    """Shown in the back office, never written from it."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(ReadOnlyAdmin):
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
    list_filter = ("status", EndpointFilter, ForgettableFilter)
    search_fields = ("key", "scope")
    exclude = ("response_body",)
    readonly_fields = [
        f.name
        for f in IdempotencyRecord._meta.fields
        if f.name not in ("id", "response_body")
    ]
    actions = ("forget",)

    # Not even deleted: a record past its first recovery point deleted would let a
    # retry run committed effects again; only "forget" below, with its guard and
    # audit.

    def has_forget_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("idempotency.add_auditentry")

    @admin.action(
        description=_("Forget these keys (only before their first recovery point)"),
        permissions=["forget"],
    )
    def forget(self, request: HttpRequest, queryset: QuerySet) -> None:
        """Free keys whose request committed nothing but its record (phased, still
        at "started"), so the client's retry runs afresh; each one recorded in the
        audit log. Anything else is refused: its record is the memory of effects
        that committed."""
        for record in queryset.order_by("pk"):
            try:
                with transaction.atomic(durable=True):  # this action is the entry point
                    record_forget(
                        record_id=record.pk,
                        actor_id=request.user.pk,
                        actor_name=request.user.get_username(),
                    )
            except KeyNotForgettable:
                self.message_user(
                    request,
                    gettext(
                        "Key %(key)s was not forgotten: it is %(status)s at "
                        "%(point)s, past its first recovery point or already gone."
                    )
                    % {
                        "key": record.key,
                        "status": record.get_status_display(),
                        "point": record.recovery_point,
                    },
                    messages.WARNING,
                )
            else:
                self.message_user(
                    request,
                    gettext("Key %(key)s forgotten; recorded in the audit log.")
                    % {"key": record.key},
                    messages.SUCCESS,
                )


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    """Who forgot which key, and when: read-only, never deleted from here."""

    list_display = ("at", "actor_name", "action", "scope", "key", "endpoint")
    # No date hierarchy: it reads every entry's day (`SELECT DISTINCT`) on each page.
    list_filter = ("action", EndpointFilter, "at")
    search_fields = ("key", "scope", "actor_name")
    readonly_fields = (
        "at",
        "actor",
        "actor_name",
        "action",
        "scope",
        "key",
        "endpoint",
        "record",
    )
    fields = readonly_fields


@admin.register(Lease)
class LeaseAdmin(ReadOnlyAdmin):
    """Which process holds each worker id and the beat lead, until when: read-only,
    since only `idempotency.leases` may write a lease (by the database's clock)."""

    list_display = ("name", "holder", "acquired_at", "expires_at")
    search_fields = ("name", "holder")
    readonly_fields = ("name", "holder", "acquired_at", "expires_at")
    fields = readonly_fields
