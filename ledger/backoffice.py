"""The back office's building blocks, shared by every app's `admin.py`.

- `money_column`: an admin column (or read-only field) that shows minor units as a
  price with its currency (`format_money`).
- `BackofficeMixin`, `ActionForm` and `action_page`: an admin action that asks for
  input (an amount, a reason) first shows a form carrying a one-time token, issued
  when the form is first shown, at a URL that names it, and signed: a token the
  server did not issue is refused as damaged. Applying it runs the
  service through `once`, an `idempotent_call` keyed by that token: pressing the
  button twice, going back and submitting again, or two browsers submitting the
  same form at once take effect once, and every press after the first gets the
  first one's outcome back.
"""

import re
import secrets
from collections.abc import Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.crypto import constant_time_compare, salted_hmac
from django.utils.html import format_html
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from idempotency.calls import idempotent_call
from idempotency.listfilters import ValuesFilter

from .currencies import SUPPORTED_CURRENCIES
from .forms import row_id
from .money import format_money

T = TypeVar("T")

TOKEN = re.compile(r"[0-9a-f]{32}")


def money_column(
    field: str,
    description: Any,
    *,
    currency: Callable[[Any], str] = lambda obj: obj.currency,
) -> Callable[[Any, Any], str]:
    """An admin display of the amount `field` as a price, sortable by the amount."""

    @admin.display(description=description, ordering=field)
    def show(self: Any, obj: Any) -> str:
        # One line: a price never wraps after its sign or symbol on a phone.
        return format_html(
            '<span class="money" style="white-space: nowrap">{}</span>',
            format_money(getattr(obj, field), currency(obj)),
        )

    show.__name__ = f"{field}_money"
    return show


class CurrencyFilter(ValuesFilter):
    """The currencies the ledger holds money in (Django's filter on the column read
    them from the whole table on every page view)."""

    title = _("currency")
    parameter_name = field = "currency"

    def values(self) -> list[tuple[str, str]]:
        return [(code, code) for code in SUPPORTED_CURRENCIES]


def one_time_token() -> str:
    """32 hex digits: 16 at random, then 16 of their HMAC under the project's secret
    key. A token the server never issued (typed in, or a page garbled into another
    token of the right shape) then fails `token_issued` and is refused as damaged,
    instead of being taken for a new operation (for a credit: a second deposit)."""
    nonce = secrets.token_hex(8)
    return nonce + _seal(nonce)


def _seal(nonce: str, secret: str | None = None) -> str:
    return salted_hmac("ledger.backoffice.token", nonce, secret=secret).hexdigest()[:16]


def token_issued(token: str) -> bool:
    """Sealed under the secret key, or under one it replaced that is still listed in
    SECRET_KEY_FALLBACKS (a form opened before the key was rotated)."""
    if not TOKEN.fullmatch(token):
        return False
    nonce, seal = token[:16], token[16:]
    keys = [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]
    return any(constant_time_compare(seal, _seal(nonce, key)) for key in keys)


DAMAGED = _("This form is damaged; open it again.")


class ServerFilledForm(forms.Form):
    """A form some of whose fields only the server fills (hidden: a one-time token,
    what the page showed). An error in one means the page was garbled or tampered
    with: staff are told so once, above the form, instead of nowhere (a hidden
    field shows no error of its own)."""

    def clean(self) -> dict[str, Any]:
        super().clean()
        damaged = [f.name for f in self.hidden_fields() if f.name in self.errors]
        if damaged:
            for name in damaged:
                del self.errors[name]
            raise forms.ValidationError(DAMAGED, code="damaged")
        return self.cleaned_data


class ActionForm(ServerFilledForm):
    """The form of an admin action that takes input. `token` is issued when the form
    is first shown and names this one intended operation."""

    token = forms.CharField(widget=forms.HiddenInput, max_length=32)

    def clean_token(self) -> str:
        token = self.cleaned_data["token"]
        if not token_issued(token):
            raise forms.ValidationError(DAMAGED)
        return token


def once(
    request: HttpRequest,
    *,
    action: str,
    token: str,
    target: int,
    data: Any,
    fn: Callable[[], T],
) -> tuple[T, bool]:
    """Run `fn` once for this staff member, action, token and target object, and
    return (its JSON result, whether this press ran it). A later press with the same
    token gets the first press's result back (False); two at once, one waits for
    the other. The same token with other `data` (the form was changed after it was
    submitted) raises `IdempotencyKeyReused`."""
    ran = False

    def run() -> T:
        nonlocal ran
        ran = True
        return fn()

    result = idempotent_call(
        f"admin:{request.user.pk}", f"{action}:{token}:{target}", run, request=data
    )
    return result, ran


class HttpResponseSeeOther(HttpResponseRedirect):
    status_code = 303


class BackofficeMixin:
    """Actions that ask for input before they act, with Post-Redirect-Get.

    The changelist's action (`start_page`) issues a one-time token and redirects to
    the action's own page, whose URL names the selected objects and the token
    (`<changelist>/backoffice/<action>/?ids=1,2&token=...`). Reloading that page,
    or coming back to it with the browser's back button, shows the same form with
    the same token, so submitting it again acts once, as the shop's order form does.
    The page's POST calls `<action>_page(request, queryset)`, which answers with the
    form again (invalid input: 400) or `done()`, a 303 back to the changelist.
    """

    MAX_OBJECTS = 100

    def get_urls(self) -> list:
        opts = self.model._meta  # type: ignore[attr-defined]
        view = self.admin_site.admin_view(self.backoffice_view)  # type: ignore[attr-defined]
        name = f"{opts.app_label}_{opts.model_name}_backoffice"
        return [
            path("backoffice/<slug:action>/", view, name=name),
            *super().get_urls(),  # type: ignore[misc]
        ]

    def start_page(
        self, request: HttpRequest, queryset: QuerySet, action: str
    ) -> HttpResponse:
        opts = self.model._meta  # type: ignore[attr-defined]
        # One more than a page: counting the whole selection only when it is over.
        pks = list(
            queryset.order_by("pk").values_list("pk", flat=True)[: self.MAX_OBJECTS + 1]
        )
        ids = ",".join(str(pk) for pk in pks[: self.MAX_OBJECTS])
        if len(pks) > self.MAX_OBJECTS:
            selected = queryset.count()
            self.message_user(  # type: ignore[attr-defined]
                request,
                gettext(
                    "Only the first %(shown)s of the %(selected)s selected are on "
                    "this page; run the action again for the rest."
                )
                % {"shown": self.MAX_OBJECTS, "selected": selected},
                messages.WARNING,
            )
        url = reverse(
            f"admin:{opts.app_label}_{opts.model_name}_backoffice", args=[action]
        )
        query = urlencode({"ids": ids, "token": one_time_token()})
        return HttpResponseSeeOther(f"{url}?{query}")

    def done(self) -> HttpResponse:
        opts = self.model._meta  # type: ignore[attr-defined]
        return HttpResponseSeeOther(
            reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        )

    def backoffice_view(self, request: HttpRequest, action: str) -> HttpResponse:
        if action not in self.get_actions(request):  # type: ignore[attr-defined]
            raise PermissionDenied
        page = getattr(self, f"{action}_page", None)
        if page is None:  # an action done at once, without a page of its own
            raise Http404
        if request.method not in ("GET", "POST"):
            return HttpResponse(status=405, headers={"Allow": "GET, POST"})
        raw = request.GET.get("ids", "").split(",")
        ids = [pk for pk in map(row_id, raw) if pk is not None]
        queryset = self.get_queryset(request).filter(pk__in=ids[: self.MAX_OBJECTS])  # type: ignore[attr-defined]
        if not queryset.exists():
            return self.done()
        return page(request, queryset)


def action_page(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    *,
    title: Any,
    form: forms.Form,
    button: Any,
    rows: Iterable[tuple[Model, str]],
    status: int = 200,
) -> HttpResponse:
    """The page of an action: the selected objects, the form with its one-time
    token, and the button that submits it."""
    opts = modeladmin.model._meta
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": title,
        "opts": opts,
        "app_label": opts.app_label,
        "form": form,
        "button": button,
        "rows": list(rows),
        "media": modeladmin.media + form.media,
    }
    response = TemplateResponse(
        request, "admin/backoffice/action_form.html", context, status=status
    )
    # Not `no-store`: the back button may then show the page (and its token) again.
    response["Cache-Control"] = "private"
    return response
