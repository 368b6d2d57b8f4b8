from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django_fsm import TransitionNotAllowed

from . import services
from .models import (
    Account,
    Hold,
    JournalEntry,
    JournalSeal,
    Posting,
    Transfer,
    TransferBatch,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    """The ledger is append-only: staff may read it, never edit it."""

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


class PostingInline(admin.TabularInline):
    model = Posting
    fields = ("account", "amount", "balance_after", "version")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(Account)
class AccountAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "kind",
        "owner",
        "code",
        "currency",
        "balance",
        "held",
        "version",
        "status",
    )
    list_filter = ("kind", "status", "currency")
    search_fields = ("owner__username", "code")
    readonly_fields = ("balance", "held", "version", "status", "created_at")
    fields = ("owner", "code", "kind", "currency", *readonly_fields)
    actions = ("freeze", "unfreeze", "close")

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def _transition(self, request: HttpRequest, queryset: QuerySet, service) -> None:
        for account in queryset.order_by("pk"):
            try:
                with transaction.atomic(durable=True):
                    service(account_id=account.pk)
            except TransitionNotAllowed:
                self.message_user(
                    request,
                    f"Account {account.pk} is {account.status}; not changed.",
                    messages.WARNING,
                )

    @admin.action(description="Freeze (money may arrive, not leave)")
    def freeze(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._transition(request, queryset, services.account_freeze)

    @admin.action(description="Unfreeze")
    def unfreeze(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._transition(request, queryset, services.account_unfreeze)

    @admin.action(description="Close for good")
    def close(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._transition(request, queryset, services.account_close)


@admin.register(JournalEntry)
class JournalEntryAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "reference", "currency", "description", "created_at")
    list_filter = ("kind", "currency")
    search_fields = ("reference", "description")
    date_hierarchy = "created_at"
    inlines = (PostingInline,)


@admin.register(Posting)
class PostingAdmin(ReadOnlyAdmin):
    list_display = ("id", "entry", "account", "amount", "balance_after", "version")
    list_select_related = ("entry", "account")
    search_fields = ("entry__reference",)


@admin.register(JournalSeal)
class JournalSealAdmin(ReadOnlyAdmin):
    """The journal's hash chain, as the sealer wrote it (check_ledger verifies it)."""

    list_display = ("seq", "entry", "hash", "sealed_at")
    list_select_related = ("entry",)
    search_fields = ("hash", "entry__reference")


@admin.register(Transfer)
class TransferAdmin(ReadOnlyAdmin):
    """Transfers between customers: money moves only through the API's service."""

    list_display = (
        "id",
        "batch",
        "sender",
        "recipient",
        "amount",
        "currency",
        "created_at",
    )
    list_select_related = ("batch", "sender", "recipient")
    list_filter = ("currency",)
    search_fields = ("sender__username", "recipient__username", "description")
    date_hierarchy = "created_at"


@admin.register(TransferBatch)
class TransferBatchAdmin(ReadOnlyAdmin):
    list_display = ("id", "sender", "created_at")
    list_select_related = ("sender",)
    search_fields = ("sender__username",)


@admin.register(Hold)
class HoldAdmin(ReadOnlyAdmin):
    """Holds move only through their services (the payment's capture and void, in
    the Payments admin, and the expiry): read-only here."""

    list_display = (
        "id",
        "account",
        "amount",
        "status",
        "reference",
        "expires_at",
        "created_at",
        "released_at",
    )
    list_filter = ("status",)
    search_fields = ("reference", "account__owner__username")
    list_select_related = ("account", "account__owner")
