"""The back office's building blocks, shared by every app's `admin.py`.

- `money_column`: an admin column (or read-only field) that shows minor units as a
  price with its currency (`format_money`).
- `ActionForm` and `action_page`: an admin action that asks for input (an amount, a
  reason) first shows a form carrying a one-time token, issued when the form is
  shown. Applying it runs the service through `once`, an `idempotent_call` keyed by
  that token: pressing the button twice, going back and submitting again, or two
  browsers submitting the same form at once take effect once, and every press after
  the first gets the first one's outcome back.
"""

import re
import uuid
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django import forms
from django.contrib import admin
from django.contrib.admin import helpers
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.translation import gettext_lazy as _

from idempotency.calls import idempotent_call

from .money import format_money

T = TypeVar("T")

TOKEN = re.compile(r"^[0-9a-f]{32}$")


def money_column(
    field: str,
    description: Any,
    *,
    currency: Callable[[Any], str] = lambda obj: obj.currency,
) -> Callable[[Any, Any], str]:
    """An admin display of the amount `field` as a price, sortable by the amount."""

    @admin.display(description=description, ordering=field)
    def show(self: Any, obj: Any) -> str:
        return format_money(getattr(obj, field), currency(obj))

    show.__name__ = f"{field}_money"
    return show


def one_time_token() -> str:
    return uuid.uuid4().hex


class ActionForm(forms.Form):
    """The form of an admin action that takes input. `token` is issued when the form
    is first shown and names this one intended operation."""

    token = forms.CharField(widget=forms.HiddenInput, max_length=32)

    def clean_token(self) -> str:
        token = self.cleaned_data["token"]
        if not TOKEN.match(token):
            raise forms.ValidationError(_("This form is damaged; open it again."))
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


def action_page(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet,
    *,
    action: str,
    title: Any,
    form: forms.Form,
    button: Any,
    rows: Iterable[tuple[Model, str]] = (),
    status: int = 200,
) -> HttpResponse:
    """The intermediate page of an action: the selected objects, the form and its
    one-time token, and a button that posts the action again with `apply`."""
    opts = modeladmin.model._meta
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": title,
        "opts": opts,
        "app_label": opts.app_label,
        "action": action,
        "form": form,
        "button": button,
        "rows": list(rows) or [(obj, "") for obj in queryset],
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "media": modeladmin.media + form.media,
    }
    return TemplateResponse(
        request, "admin/backoffice/action_form.html", context, status=status
    )
