import time
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.admin import GroupAdmin as DjangoGroupAdmin
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.contrib.auth.models import Group, User
from django.db import transaction
from django.db.models import OuterRef, QuerySet, Subquery, Sum
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest, HttpResponse
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _
from rest_framework.authtoken.admin import TokenAdmin as DRFTokenAdmin
from rest_framework.authtoken.models import TokenProxy

from idempotency.exceptions import IdempotencyKeyInFlight, IdempotencyKeyReused

from . import services
from .auth import token_prefix
from .backoffice import (
    ActionForm,
    BackofficeMixin,
    CurrencyFilter,
    ServerFilledForm,
    action_page,
    money_column,
    once,
)
from .exceptions import (
    AccountBusy,
    AccountNotEmpty,
    AccountTransitionRefused,
    DomainError,
    StaleVersion,
    SubAccountClosesWithMerchant,
)
from .forms import MoneyField, minor_units
from .models import (
    Account,
    Hold,
    JournalEntry,
    JournalSeal,
    Posting,
    Transfer,
    TransferBatch,
)
from .money import format_money

# The largest single credit, in minor units (as the API's largest amount).
CREDIT_MAX = 10**15
# How long one press of a freeze, unfreeze or close may work through its accounts.
TRANSITIONS_SECONDS = 20.0


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
    fields = ("account", "amount_money", "balance_after_money", "version")
    readonly_fields = fields
    extra = 0
    can_delete = False

    amount_money = money_column(
        "amount", _("amount"), currency=lambda posting: posting.entry.currency
    )
    balance_after_money = money_column(
        "balance_after",
        _("balance after"),
        currency=lambda posting: posting.entry.currency,
    )

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


class CreditForm(ActionForm):
    amount = MoneyField(label=_("Amount"), max_minor=CREDIT_MAX)
    description = forms.CharField(
        label=_("Description"),
        max_length=255,
        required=False,
        help_text=_("Shown in the customer's account history."),
    )

    def amount_minor_units(self) -> int:
        return minor_units(self.cleaned_data["amount"])


class StatusesForm(ServerFilledForm):
    """The confirmation of a state change: how many transitions each account had
    taken as shown (`status_version`), so that the change applies only to an account
    no transition touched since (money moving meanwhile does not count)."""

    def __init__(self, *args, accounts: list[Account], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for account in accounts:
            self.fields[f"status_{account.pk}"] = forms.IntegerField(
                widget=forms.HiddenInput, initial=account.status_version
            )


# The refusals staff meet in the back office, by their stable code, in the reader's
# language (the API's `detail` is English). Apps above add theirs.
REFUSALS: dict[str, Any] = {
    "account_not_active": _("The account is not active; nothing was done."),
    "not_a_wallet": _("Only a customer's wallet can be credited; nothing was done."),
    "reference_conflict": _(
        "Another entry already carries this reference; nothing was done."
    ),
    "currency_mismatch": _("The currencies do not match; nothing was done."),
    "insufficient_funds": _("Not enough money in the account; nothing was done."),
}


def refusal_message(exc: Exception) -> str:
    """What staff read when a press did nothing (in their language)."""
    if isinstance(exc, IdempotencyKeyReused):
        return gettext(
            "This form was already submitted with other values; nothing more was "
            "done. Open the action again to do something new."
        )
    if isinstance(exc, IdempotencyKeyInFlight):
        return gettext("The same form is still being processed; look again shortly.")
    if isinstance(exc, DomainError):
        return str(REFUSALS.get(exc.code, exc.detail))
    raise exc


def _money_and_hold(balance: int, held: int, currency: str) -> str:
    """`¥1.50`, or with a hold `¥1.50 (¥0.40 of it on hold)`, in the reader's
    language."""
    money = format_money(balance, currency)
    if not held:
        return money
    return gettext("%(money)s (%(held)s of it on hold)") % {
        "money": money,
        "held": format_money(held, currency),
    }


@admin.register(Account)
class AccountAdmin(BackofficeMixin, ReadOnlyAdmin):
    """Accounts are made by the services (a customer's wallet, a currency's merchant
    and outside world) and change only through entries and the actions below: no
    add form, whose codes and currencies could shadow the ledger's own accounts, and
    no Save, which would write back the balance the page read while payments moved
    it."""

    # What staff look for first comes first: a phone shows the first columns.
    list_display = (
        "id",
        "owner",
        "balance_money",
        "held_money",
        "status",
        "kind",
        "code",
        "currency",
        "version",
    )
    list_filter = ("kind", "status", CurrencyFilter)
    search_fields = ("owner__username", "code")
    list_select_related = ("owner",)
    readonly_fields = (
        "balance_money",
        "held_money",
        "version",
        "status",
        "parent",
        "created_at",
    )
    fields = ("owner", "code", "kind", "currency", *readonly_fields)
    actions = ("credit", "freeze", "unfreeze", "close")

    balance_money = money_column("balance", _("balance"))
    held_money = money_column("held", _("held"))

    # Who may press what: a deposit is a journal entry; a transition changes the
    # account. Staff who may only look at accounts see no action (nor its page).
    def has_credit_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("ledger.add_journalentry")

    def has_transition_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("ledger.change_account")

    has_freeze_permission = has_transition_permission
    has_unfreeze_permission = has_transition_permission
    has_close_permission = has_transition_permission

    @admin.action(
        description=_("Credit the customer (a deposit entry)"), permissions=["credit"]
    )
    def credit(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse:
        return self.start_page(request, queryset, "credit")

    def credit_page(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse:
        """Deposit the amount into each selected wallet, once per form (its token
        names the deposit: `admin-credit:<token>:<account>`)."""
        accounts = list(queryset.order_by("pk"))
        if request.method != "POST":
            form = CreditForm(initial={"token": request.GET.get("token", "")})
            return self._credit_form(request, accounts, form)
        form = CreditForm(request.POST)
        if not form.is_valid():
            return self._credit_form(request, accounts, form, status=400)
        token = form.cleaned_data["token"]
        amount = form.amount_minor_units()
        description = form.cleaned_data["description"] or gettext("Staff credit")
        for account in accounts:

            def credit(account: Account = account) -> dict:
                entry = services.account_credit(
                    account_id=account.pk,
                    amount=amount,
                    reference=f"admin-credit:{token}:{account.pk}",
                    description=description,
                )
                return {"entry": entry.pk}

            try:
                result, ran = once(
                    request,
                    action="credit",
                    token=token,
                    target=account.pk,
                    # What staff typed, not the default text in their language:
                    # the same form pressed again after a language switch is the
                    # same operation.
                    data={
                        "amount": amount,
                        "description": form.cleaned_data["description"],
                    },
                    fn=credit,
                )
            except Exception as exc:
                self.message_user(request, refusal_message(exc), messages.ERROR)
                continue
            text = gettext("Credited %(amount)s to %(account)s (entry %(entry)s).") % {
                "amount": format_money(amount, account.currency),
                "account": account,
                "entry": result["entry"],
            }
            if not ran:
                text += " " + gettext("(Submitted before: done once.)")
            self.message_user(request, text, messages.SUCCESS)
        return self.done()

    def _credit_form(self, request, accounts, form, status: int = 200):
        return action_page(
            self,
            request,
            title=gettext("Credit the customer"),
            form=form,
            button=gettext("Credit"),
            rows=[
                (account, format_money(account.balance, account.currency))
                for account in accounts
            ],
            status=status,
        )

    def _transition(
        self, request: HttpRequest, queryset: QuerySet, service, title
    ) -> HttpResponse:
        """Show the accounts with their statuses; apply the change to each account
        only if no transition touched it since (a second press finds it changed)."""
        accounts = list(queryset.order_by("pk"))
        form = StatusesForm(
            request.POST if request.method == "POST" else None, accounts=accounts
        )
        if not form.is_bound or not form.is_valid():
            return action_page(
                self,
                request,
                title=title,
                form=form,
                button=gettext("Yes, I'm sure"),
                rows=[(account, account.get_status_display()) for account in accounts],
                status=400 if form.is_bound else 200,
            )
        # Each busy account may wait `CLOSE_LOCK_SECONDS` for its lock: past this
        # budget the rest are left as they are, well inside the server's timeout.
        deadline = time.monotonic() + TRANSITIONS_SECONDS
        for done, account in enumerate(accounts):
            if time.monotonic() > deadline:
                self.message_user(
                    request,
                    gettext(
                        "Not reached in time, so not changed: %(accounts)s. Select "
                        "them and try again."
                    )
                    % {"accounts": ", ".join(str(left) for left in accounts[done:])},
                    messages.WARNING,
                )
                break
            try:
                with transaction.atomic(durable=True):  # this page is the entry point
                    changed = service(
                        account_id=account.pk,
                        seen_status_version=form.cleaned_data[f"status_{account.pk}"],
                    )
            except StaleVersion:
                self.message_user(
                    request,
                    gettext(
                        "%(account)s changed since you looked at it; not changed. "
                        "Look at it again."
                    )
                    % {"account": account},
                    messages.WARNING,
                )
            except AccountBusy:
                self.message_user(
                    request,
                    gettext(
                        "%(account)s is busy (money is moving through it); not "
                        "changed. Try again in a moment."
                    )
                    % {"account": account},
                    messages.WARNING,
                )
            except AccountNotEmpty as refused:
                self.message_user(
                    request,
                    gettext(
                        "%(account)s not closed: account %(id)s holds %(money)s, and "
                        "only an account that holds nothing can be closed."
                    )
                    % {
                        "account": account,
                        "id": refused.account_id,
                        "money": _money_and_hold(
                            refused.balance, refused.held, refused.currency
                        ),
                    },
                    messages.WARNING,
                )
            except SubAccountClosesWithMerchant:
                text = (
                    gettext(
                        "%(account)s is a sub-account of the outside world's "
                        "account; not closed. It closes with the outside world's "
                        "account."
                    )
                    if account.kind == Account.Kind.EXTERNAL
                    else gettext(
                        "%(account)s is a merchant sub-account; not closed. It "
                        "closes with its merchant."
                    )
                )
                self.message_user(
                    request, text % {"account": account}, messages.WARNING
                )
            except AccountTransitionRefused:
                self.message_user(
                    request,
                    gettext("%(account)s is %(status)s; not changed.")
                    % {"account": account, "status": account.get_status_display()},
                    messages.WARNING,
                )
            else:
                self.message_user(
                    request,
                    gettext("%(account)s is now %(status)s.")
                    % {"account": changed, "status": changed.get_status_display()},
                    messages.SUCCESS,
                )
        return self.done()

    @admin.action(
        description=_("Freeze (nothing leaves; refunds and credits still arrive)"),
        permissions=["freeze"],
    )
    def freeze(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse:
        return self.start_page(request, queryset, "freeze")

    def freeze_page(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse:
        return self._transition(
            request,
            queryset,
            services.account_freeze,
            gettext("Freeze these accounts?"),
        )

    @admin.action(description=_("Unfreeze"), permissions=["unfreeze"])
    def unfreeze(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse:
        return self.start_page(request, queryset, "unfreeze")

    def unfreeze_page(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse:
        return self._transition(
            request,
            queryset,
            services.account_unfreeze,
            gettext("Unfreeze these accounts?"),
        )

    @admin.action(
        description=_("Close for good (only an empty account)"), permissions=["close"]
    )
    def close(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse:
        return self.start_page(request, queryset, "close")

    def close_page(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse:
        return self._transition(
            request,
            queryset,
            services.account_close,
            gettext("Close these accounts for good?"),
        )


@admin.register(JournalEntry)
class JournalEntryAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "kind",
        "reference",
        "amount_money",
        "description",
        "created_at",
    )
    # No date hierarchy: it reads every entry's day (`SELECT DISTINCT`) on each page.
    list_filter = ("kind", CurrencyFilter, "created_at")
    search_fields = ("reference", "description")
    inlines = (PostingInline,)
    readonly_fields = (
        "reference",
        "kind",
        "amount_money",
        "currency",
        "description",
        "created_at",
    )
    fields = readonly_fields

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # An entry's amount: what its postings move (the sum of its credits). A
        # subquery, not a join: the list's count leaves it out, where a join grouped
        # every posting of the journal to count the entries.
        credits = (
            Posting.objects.filter(entry=OuterRef("pk"), amount__gt=0)
            .values("entry")
            .annotate(total=Sum("amount"))
            .values("total")
        )
        return super().get_queryset(request).annotate(moved=Subquery(credits))

    amount_money = money_column("moved", _("amount"))


@admin.register(Posting)
class PostingAdmin(ReadOnlyAdmin):
    list_display = ("id", "entry", "account", "amount_money", "balance_after_money")
    list_select_related = ("entry", "account", "account__owner")
    search_fields = ("entry__reference",)
    readonly_fields = (
        "entry",
        "account",
        "amount_money",
        "balance_after_money",
        "version",
    )
    fields = readonly_fields

    amount_money = money_column(
        "amount", _("amount"), currency=lambda posting: posting.account.currency
    )
    balance_after_money = money_column(
        "balance_after",
        _("balance after"),
        currency=lambda posting: posting.account.currency,
    )


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
        "amount_money",
        "created_at",
    )
    list_select_related = ("batch", "sender", "recipient")
    list_filter = (CurrencyFilter, "created_at")
    search_fields = ("sender__username", "recipient__username", "description")

    amount_money = money_column("amount", _("amount"))


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
        "amount_money",
        "status",
        "reference",
        "expires_at",
        "created_at",
        "released_at",
    )
    list_filter = ("status",)
    search_fields = ("reference", "account__owner__username")
    list_select_related = ("account", "account__owner")

    amount_money = money_column(
        "amount", _("amount"), currency=lambda hold: hold.account.currency
    )


admin.site.unregister(TokenProxy)


@admin.register(TokenProxy)
class TokenAdmin(DRFTokenAdmin):
    """DRF's token admin, with the key shown only by its prefix (as `str()` names
    a token, see `ledger.apps`) and never usable as a filter: `?key__startswith=a`
    (or `pk`, which is the key) would find it out a character at a time. Deleting
    a token still revokes it (`idempotency.signals`)."""

    list_display = ("key_prefix", "user", "created")
    readonly_fields = ("key_prefix", "created")

    def get_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return ("user",) if obj is None else ("key_prefix", "user", "created")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # A token is its user's for good: handed to another user, whoever holds it
        # (staff who may change tokens, holding their own) would act as that user
        # in the API, and spend their wallet.
        fields = super().get_readonly_fields(request, obj)
        return fields if obj is None else (*fields, "user")

    @admin.display(description=_("key"))
    def key_prefix(self, token: TokenProxy) -> str:
        return token_prefix(token.key)

    def lookup_allowed(self, lookup: str, value: str, request: Any = None) -> bool:
        if lookup.split(LOOKUP_SEP)[0] in ("key", "pk"):
            return False
        return super().lookup_allowed(lookup, value, request)


# Staff who may manage users or groups are not thereby superusers. Django's own
# user and group pages let anyone with `change_user` make themselves a superuser or
# grant themselves any permission, and set the password of any account, a
# superuser's too, and then log in as it; `change_group` let them add any
# permission to a group of theirs. Only a superuser grants power here: to others,
# what grants it is read-only, and a staff account is not theirs to change.
POWER_FIELDS = ("is_staff", "is_superuser", "groups", "user_permissions")


def grants_power(request: HttpRequest) -> bool:
    return request.user.is_superuser


admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class UserAdmin(DjangoUserAdmin):
    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = super().get_readonly_fields(request, obj)
        return fields if grants_power(request) else (*fields, *POWER_FIELDS)

    def _may_touch(self, request: HttpRequest, obj: Any) -> bool:
        return (
            obj is None
            or grants_power(request)
            or not (obj.is_staff or obj.is_superuser)
        )

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # (Its password page asks this too.)
        return self._may_touch(request, obj) and super().has_change_permission(
            request, obj
        )

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._may_touch(request, obj) and super().has_delete_permission(
            request, obj
        )


@admin.register(Group)
class GroupAdmin(DjangoGroupAdmin):
    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = super().get_readonly_fields(request, obj)
        return fields if grants_power(request) else (*fields, "permissions")
