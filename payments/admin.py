import time
from collections.abc import Callable

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from idempotency.listfilters import ValuesFilter
from ledger.admin import REFUSALS, ReadOnlyAdmin, refusal_message
from ledger.auth import authenticated
from ledger.backoffice import (
    ActionForm,
    BackofficeMixin,
    CurrencyFilter,
    action_page,
    money_column,
    once,
)
from ledger.exceptions import DomainError
from ledger.money import format_money
from orders.admin import OrderAdmin
from orders.models import Order

from .exceptions import ProviderUnavailable
from .models import (
    CALLBACK_STATUSES,
    CallbackNonce,
    ChargeTakenUp,
    Payment,
    ProviderEvent,
    Refund,
    Shipment,
)
from .selectors import (
    other_charges_collected_in_events,
    other_charges_collected_on_payments,
)
from .services import (
    charge_take_up,
    payment_capture,
    payment_redrive_parked,
    payment_refund,
    payment_void,
    provider_event_redrive,
    refund_reason_is_reserved,
)

REFUSALS.update(
    already_refunded=_("This payment was already refunded; nothing was done."),
    payment_not_refundable=_(
        "Only a succeeded payment can be refunded; nothing was done."
    ),
    payment_not_capturable=_(
        "Only an authorized payment whose hold has not expired can be captured; "
        "nothing was done."
    ),
    payment_not_voidable=_(
        "Only an authorized payment can be voided; nothing was done."
    ),
)


class RefundForm(ActionForm):
    reason = forms.CharField(
        label=_("Reason"),
        max_length=64,
        initial="requested",
        help_text=_("Kept with the refund (at most 64 characters)."),
    )

    def clean_reason(self) -> str:
        reason = self.cleaned_data["reason"]
        if refund_reason_is_reserved(reason):
            raise forms.ValidationError(
                _(
                    "“%(reason)s” is reserved for refunds the system makes; give "
                    "another reason."
                ),
                code="refund_reason_reserved",
                params={"reason": reason},
            )
        return reason


class PaymentInline(admin.TabularInline):
    model = Payment
    fields = ("id", "method", "amount_money", "status", "created_at")
    readonly_fields = fields
    amount_money = money_column("amount", _("amount"))
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


# An order's page in the admin lists its payments: orders know nothing of payments, so
# the inline is added here, on top.
admin.site.unregister(Order)


@admin.register(Order)
class OrderWithPaymentsAdmin(OrderAdmin):
    def get_inlines(self, request: HttpRequest, obj: Order | None) -> list:
        return [*super().get_inlines(request, obj), PaymentInline]


# The charges a message names; the rest are counted.
TXNS_NAMED = 10


def take_up(
    model_admin: admin.ModelAdmin, request: HttpRequest, txns: list[str]
) -> None:
    """Record each of `txns`, charges reported collected in an answer about
    another charge, taken up with the provider by this staff member: `check_ledger`
    stops naming them. No input, so no token: each is recorded once (the service's
    unique transaction id), and a second press or a second staff member is told it
    was recorded before."""
    if not txns:
        model_admin.message_user(
            request,
            gettext(
                "None of the selected rows reports another charge collected; "
                "nothing was recorded."
            ),
            messages.WARNING,
        )
        return
    made = before = 0
    for txn in txns:
        with transaction.atomic(durable=True):  # the admin is the entry point
            recorded = charge_take_up(
                provider_txn_id=txn, user_id=authenticated(request).pk
            )
        if recorded:
            made += 1
        else:
            before += 1
    parts = [
        ngettext("%(n)d recorded", "%(n)d recorded", made),
        ngettext("%(n)d recorded before", "%(n)d recorded before", before),
    ]
    summary = ", ".join(
        part % {"n": n} for part, n in zip(parts, (made, before), strict=True) if n
    )
    named = ", ".join(txns[:TXNS_NAMED])
    if len(txns) > TXNS_NAMED:
        named += ", …"
    model_admin.message_user(
        request,
        gettext("Taken up with the provider (%(txns)s): %(summary)s.")
        % {"txns": named, "summary": summary},
        messages.SUCCESS if made else messages.INFO,
    )


def has_take_up_permission(request: HttpRequest) -> bool:
    return request.user.has_perm("payments.add_chargetakenup")


TAKE_UP = _("Taken up with the provider (check_ledger stops naming the charge)")


class HeardOfAnotherChargeFilter(admin.SimpleListFilter):
    """The provider payments whose re-drive or reconciliation heard of a charge
    that is not theirs, read through their partial index."""

    title = _("answer about another charge")
    parameter_name = "another_charge"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list:
        return [("yes", _("Yes"))]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[Payment]
    ) -> QuerySet[Payment]:
        if self.value() == "yes":
            return queryset.exclude(other_charge_txn_id="")
        return queryset


@admin.register(Payment)
class PaymentAdmin(BackofficeMixin, ReadOnlyAdmin):
    """Payments are records of money that moved: read-only here; refunds go through
    their service (the API's) so the ledger moves with them. An authorized payment
    (manual capture) can be captured in full or voided: each action calls the same
    service as the API, once per payment per click, in its own transaction; a
    payment no longer authorized (a second click, a race with the expiry) is
    skipped. A provider payment beat's re-drive parked (its answer refused by the
    ledger) shows why, and is re-driven once its cause is fixed."""

    list_display = (
        "id",
        "order",
        "amount_money",
        "status",
        "method",
        "created_at",
        "succeeded_at",
        "redrive_parked",
    )
    list_filter = (
        "status",
        "method",
        CurrencyFilter,
        "created_at",
        ("redrive_parked_at", admin.EmptyFieldListFilter),
        HeardOfAnotherChargeFilter,
    )
    search_fields = ("order__merchant_order_no", "order__owner__username")
    list_select_related = ("order",)
    # No date hierarchy: it reads every payment's day (`SELECT DISTINCT`) on each
    # page.
    readonly_fields = (
        "order",
        "method",
        "amount_money",
        "currency",
        "status",
        "journal_entry",
        "created_at",
        "updated_at",
        "succeeded_at",
        "provider_txn_id",
        "pay_url",
        "charge_cancel",
        "charge_cancelled_at",
        "authorized_amount",
        "hold",
        "redrive_attempts",
        "redrive_error",
        "redrive_parked_at",
        "other_charge_txn_id",
        "other_charge_status",
    )
    fields = readonly_fields
    actions = ("refund", "capture", "void", "redrive", "take_up")
    # How long one press of "re-drive" starts re-drives for (see `redrive`): with
    # one provider call at PAYMENT_PROVIDER_TIMEOUT_SECONDS after it, well inside
    # the web server's 30 s.
    redrive_seconds = 10.0

    @admin.display(description=_("re-drive parked"), ordering="redrive_parked_at")
    def redrive_parked(self, payment: Payment) -> str:
        """Why beat stopped re-driving it, for a parked payment."""
        return payment.redrive_error if payment.redrive_parked_at else ""

    def has_redrive_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("payments.change_payment")

    @admin.action(
        description=_("Re-drive parked payments (ask the provider again, once)"),
        permissions=["redrive"],
    )
    def redrive(self, request: HttpRequest, queryset: QuerySet) -> None:
        """No input, so no token: the service re-drives only a parked payment, by
        a conditional update, so a second press or a second staff member finds it
        moved on. Outside any transaction: the re-drive asks the provider.

        Each re-drive may wait on the provider (up to
        PAYMENT_PROVIDER_TIMEOUT_SECONDS), so a press starts re-drives only for
        `redrive_seconds` and stops at a provider that does not answer: what is
        left stays parked, and the page says how many, instead of the web server's
        timeout cutting the press short with nothing said. The payment the provider
        did not answer for is unparked already: beat re-drives it from then on."""
        outcomes = {"redriven": 0, "failed": 0, "skipped": 0, "left": 0}
        pks = list(queryset.order_by("pk").values_list("pk", flat=True))
        started = time.monotonic()
        for done, pk in enumerate(pks):
            if done and time.monotonic() - started > self.redrive_seconds:
                outcomes["left"] = len(pks) - done
                break
            try:
                payment, redriven = payment_redrive_parked(payment_id=pk)
            except DomainError as exc:
                outcomes["failed"] += 1
                self.message_user(
                    request,
                    gettext("Payment %(id)s: %(why)s Beat re-drives it from now on.")
                    % {"id": pk, "why": refusal_message(exc)},
                    messages.WARNING,
                )
                if isinstance(exc, ProviderUnavailable):
                    outcomes["left"] = len(pks) - done - 1
                    break
                continue
            if not redriven:
                outcomes["skipped"] += 1
            elif payment.redrive_attempts:
                outcomes["failed"] += 1
                self.message_user(
                    request,
                    gettext("Payment %(id)s: %(why)s")
                    % {"id": pk, "why": payment.redrive_error},
                    messages.WARNING,
                )
            else:
                outcomes["redriven"] += 1
        parts = [
            ngettext("%(n)d re-driven", "%(n)d re-driven", outcomes["redriven"]),
            ngettext("%(n)d failed again", "%(n)d failed again", outcomes["failed"]),
            ngettext(
                "%(n)d skipped (not parked)",
                "%(n)d skipped (not parked)",
                outcomes["skipped"],
            ),
            ngettext(
                "%(n)d not tried (still parked: re-drive it again)",
                "%(n)d not tried (still parked: re-drive them again)",
                outcomes["left"],
            ),
        ]
        counts = [
            outcomes["redriven"],
            outcomes["failed"],
            outcomes["skipped"],
            outcomes["left"],
        ]
        summary = ", ".join(
            part % {"n": n} for part, n in zip(parts, counts, strict=True) if n
        )
        level = messages.SUCCESS if outcomes["redriven"] else messages.INFO
        self.message_user(
            request, gettext("Re-drive: %(summary)s.") % {"summary": summary}, level
        )

    def has_take_up_permission(self, request: HttpRequest) -> bool:
        return has_take_up_permission(request)

    @admin.action(description=TAKE_UP, permissions=["take_up"])
    def take_up(self, request: HttpRequest, queryset: QuerySet) -> None:
        """For the charge a re-drive or the reconciliation heard was collected
        (filter "answer about another charge"), once an operator has taken it up
        with the provider."""
        take_up(self, request, other_charges_collected_on_payments(queryset))

    amount_money = money_column("amount", _("amount"))

    def has_refund_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("payments.add_refund")

    @admin.action(
        description=_("Refund (the money goes back once)"), permissions=["refund"]
    )
    def refund(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse:
        return self.start_page(request, queryset, "refund")

    def refund_page(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse:
        """The API's refund, from a form with a one-time token: however often it is
        submitted, each payment is refunded once, and every press after the first
        gets the first one's outcome."""
        payments = list(queryset.select_related("order").order_by("pk"))
        if request.method == "POST":
            form = RefundForm(request.POST)
        else:
            form = RefundForm(initial={"token": request.GET.get("token", "")})
        if not form.is_bound or not form.is_valid():
            return action_page(
                self,
                request,
                title=gettext("Refund these payments?"),
                form=form,
                button=gettext("Refund"),
                rows=[
                    (payment, format_money(payment.amount, payment.currency))
                    for payment in payments
                ],
                status=400 if form.is_bound else 200,
            )
        token, reason = form.cleaned_data["token"], form.cleaned_data["reason"]
        for payment in payments:

            def refund(payment: Payment = payment) -> dict:
                made = payment_refund(payment_id=payment.pk, reason=reason)
                return {"refund": made.pk}

            try:
                result, ran = once(
                    request,
                    action="refund",
                    token=token,
                    target=payment.pk,
                    data={"reason": reason},
                    fn=refund,
                )
            except Exception as exc:
                self.message_user(request, refusal_message(exc), messages.ERROR)
                continue
            text = gettext(
                "Refunded %(amount)s of order %(order)s (refund %(refund)s)."
            ) % {
                "amount": format_money(payment.amount, payment.currency),
                "order": payment.order.merchant_order_no,
                "refund": result["refund"],
            }
            if not ran:
                text += " " + gettext("(Submitted before: done once.)")
            self.message_user(request, text, messages.SUCCESS)
        return self.done()

    def has_capture_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("payments.change_payment")

    has_void_permission = has_capture_permission

    @admin.action(
        description=_("Capture authorized payments (in full)"), permissions=["capture"]
    )
    def capture(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._each(request, queryset, payment_capture, gettext("Captured"))

    @admin.action(
        description=_("Void authorized payments (release the hold)"),
        permissions=["void"],
    )
    def void(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._each(request, queryset, payment_void, gettext("Voided"))

    def _each(
        self,
        request: HttpRequest,
        queryset: QuerySet,
        service: Callable[..., object],
        done: str,
    ) -> None:
        made = skipped = 0
        for pk in queryset.order_by("pk").values_list("pk", flat=True):
            try:
                with transaction.atomic(durable=True):  # the admin is the entry point
                    service(payment_id=pk)
            except DomainError as exc:
                skipped += 1
                self.message_user(
                    request,
                    gettext("Payment %(id)s: %(why)s")
                    % {"id": pk, "why": refusal_message(exc)},
                    messages.WARNING,
                )
            else:
                made += 1
        self.message_user(
            request,
            gettext("%(done)s: %(made)d, skipped: %(skipped)d.")
            % {"done": done, "made": made, "skipped": skipped},
            messages.INFO,
        )


@admin.register(Refund)
class RefundAdmin(ReadOnlyAdmin):
    """Refunds are made by `payment_refund` (money moves with them): read-only."""

    list_display = (
        "id",
        "payment",
        "amount_money",
        "reason",
        "at_provider",
        "created_at",
    )
    # A reason is free text: searched for, not offered as a filter (whose choices
    # Django read from the whole table).
    list_filter = (CurrencyFilter, "at_provider")
    search_fields = ("payment__order__merchant_order_no", "reason")
    amount_money = money_column("amount", _("amount"))
    readonly_fields = (
        "payment",
        "amount_money",
        "currency",
        "reason",
        "journal_entry",
        "at_provider",
        "returned_at",
        "created_at",
    )
    fields = readonly_fields


class AboutAnotherChargeFilter(admin.SimpleListFilter):
    """The events about a charge that is not their payment's, read through their
    partial index. (A filter on `outcome` itself would offer every outcome ever
    written, which Django finds by reading the whole inbox on every page.)"""

    title = _("about another charge")
    parameter_name = "another_charge"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list:
        return [("yes", _("Yes"))]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[ProviderEvent]
    ) -> QuerySet[ProviderEvent]:
        if self.value() == "yes":
            return queryset.filter(outcome=ProviderEvent.NOT_ITS_CHARGE)
        return queryset


class ReportedStatusFilter(ValuesFilter):
    """The statuses a callback can report."""

    title = _("reported status")
    parameter_name = field = "kind"

    def values(self) -> list[tuple[str, str]]:
        return [(kind, kind) for kind in CALLBACK_STATUSES]


@admin.register(ProviderEvent)
class ProviderEventAdmin(ReadOnlyAdmin):
    """The inbox of provider callbacks, as received. Filter by status `parked` for
    the ones that failed PROVIDER_EVENT_MAX_ATTEMPTS times; once the cause is fixed,
    the "re-drive" action processes them again, once. Filter "about another charge"
    for the ones about another charge than their payment's,
    processed changing nothing (never re-driven: the payment waits for its own);
    once the charge such an event reported collected is taken up with the
    provider, "Taken up with the provider" records it and `check_ledger` stops
    naming it."""

    list_display = (
        "event_id",
        "payment",
        "kind",
        "status",
        "outcome",
        "attempts",
        "last_error",
        "received_at",
        "parked_at",
    )
    list_filter = ("status", ReportedStatusFilter, AboutAnotherChargeFilter)
    search_fields = ("event_id", "payment__order__merchant_order_no")
    actions = ("redrive", "take_up")

    def has_redrive_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("payments.change_providerevent")

    def has_take_up_permission(self, request: HttpRequest) -> bool:
        return has_take_up_permission(request)

    @admin.action(description=TAKE_UP, permissions=["take_up"])
    def take_up(self, request: HttpRequest, queryset: QuerySet) -> None:
        """For the charge a callback about another charge reported collected
        (filter "about another charge"), once an operator has taken it up with the
        provider."""
        take_up(self, request, other_charges_collected_in_events(queryset))

    @admin.action(
        description=_("Re-drive parked events (process them again, once)"),
        permissions=["redrive"],
    )
    def redrive(self, request: HttpRequest, queryset: QuerySet) -> None:
        """No input, so no token: the service re-drives only a parked event, under
        its row lock, so a second press or a second operator finds it moved on."""
        outcomes = {"processed": 0, "failed": 0, "skipped": 0}
        for pk in queryset.order_by("pk").values_list("pk", flat=True):
            event, redriven = provider_event_redrive(event_id=pk)
            if not redriven:
                outcomes["skipped"] += 1
            elif event.status == ProviderEvent.Status.PROCESSED:
                outcomes["processed"] += 1
            else:
                outcomes["failed"] += 1
                self.message_user(
                    request,
                    gettext("Event %(event)s failed again: %(error)s")
                    % {"event": event.event_id, "error": event.last_error},
                    messages.WARNING,
                )
        parts = [
            ngettext("%(n)d processed", "%(n)d processed", outcomes["processed"]),
            ngettext("%(n)d failed again", "%(n)d failed again", outcomes["failed"]),
            ngettext(
                "%(n)d skipped (not parked)",
                "%(n)d skipped (not parked)",
                outcomes["skipped"],
            ),
        ]
        counts = [outcomes["processed"], outcomes["failed"], outcomes["skipped"]]
        summary = ", ".join(
            part % {"n": n} for part, n in zip(parts, counts, strict=True) if n
        )
        level = messages.SUCCESS if outcomes["processed"] else messages.INFO
        self.message_user(
            request, gettext("Re-drive: %(summary)s.") % {"summary": summary}, level
        )


@admin.register(ChargeTakenUp)
class ChargeTakenUpAdmin(ReadOnlyAdmin):
    """The charges staff recorded taken up with the provider (the action "Taken up
    with the provider" on provider events and payments): who and when. A record, so
    read-only."""

    list_display = ("provider_txn_id", "taken_up_by", "taken_up_at")
    list_select_related = ("taken_up_by",)
    search_fields = ("provider_txn_id",)
    fields = readonly_fields = list_display


@admin.register(Shipment)
class ShipmentAdmin(ReadOnlyAdmin):
    list_display = ("order", "status", "created_at", "dispatched_at")
    list_filter = ("status",)


@admin.register(CallbackNonce)
class CallbackNonceAdmin(ReadOnlyAdmin):
    """The callback nonces seen and not yet purged: a nonce here refuses a replayed
    callback, so none is edited or deleted by hand."""

    list_display = ("nonce", "expires_at")
    search_fields = ("nonce",)
