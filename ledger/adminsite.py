"""The admin site the back office runs on: Django's, with every list refusing a
filter in its address that it cannot apply, and every action a selection it cannot
act on, never with a 500, and every action needing a permission.

Django lets a list's address filter on any column with any lookup, and refuses
what it cannot apply as it builds the query (`?e=1`, its "database error" page).
Some values fail only later, when the query is compiled or run: a year past 9999
(`?created_at__year=99999`), the year 9999 in a date hierarchy (the next year is
its bound), a regular expression PostgreSQL cannot read (`?id__regex=(`), a range
of one value, a number past 64 bits on SQLite, a text lookup on a binary column.
Every list on this site answers those as Django answers any bad filter, and logs
them with their traceback, so that a real fault behind a filter is still seen. A
list whose address carries no parameter has nothing to refuse: its failures stay
500s.

Every action on the site needs a permission: one that names none (beat's enable,
disable and run, say) needs the right to change the model, so that staff who may
only look are offered nothing that changes anything (the project's own actions name
theirs: `@admin.action(permissions=[...])`).

An action runs only on a selection whose every id could name a row of its list
(`_selected_action=abc`, `1.5`, empty or a NUL made Django's filter raise, a 500):
anything else is refused as Django refuses an action it does not know, with a
message on the list and nothing done.

An action acts on at most `ACTION_ROWS_MAX` rows a request. Django's "select all"
hands it every row the list's filters leave, thousands, in one request, which the
web server's timeout cuts short halfway (what committed stays, the rest is never
done, and the page never says which). A larger selection is refused, nothing done,
with a message that says how many it holds and how many may be acted on.

An add or change form checks its unique values (a product's SKU, a username, the
user of a token) before it saves, but two presses at the same instant (a double
click on Save, two staff members) both pass that check, and the second INSERT broke
the unique constraint: a 500. The site's forms then answer as for a press that came
second: the form again, with the value named taken, and nothing saved twice.

Every list counts a large table by PostgreSQL's estimate while it is unfiltered,
and never counts the whole table beside a filtered count (`show_full_result_count`
off): both were a full scan on every page view (idempotency.listfilters).

The site puts these on every admin registered on it, Django's and other apps' too
(users, tokens, beat's schedules).
"""

import logging
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ValidationError
from django.db import DatabaseError, IntegrityError, models, transaction
from django.db.models import Field, QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.translation import gettext

from idempotency.listfilters import EstimatedCountPaginator

from .forms import row_id

logger = logging.getLogger(__name__)

# What a value in a list's address can raise once Django has taken it.
UNUSABLE_FILTER = (ValueError, TypeError, OverflowError, IndexError, DatabaseError)


class FilterRefusingAdmin(admin.ModelAdmin):
    """A ModelAdmin whose list refuses an unusable filter (see the module doc)."""

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        # Its query runs here too (the count of the rows the filters leave), in a
        # transaction or savepoint of its own: a statement the database refused
        # must not leave a caller's transaction aborted.
        try:
            with transaction.atomic():
                return super().get_changelist_instance(request)
        except UNUSABLE_FILTER as error:
            if not request.GET:
                raise
            logger.warning(
                "admin list %s refused its filters", request.path, exc_info=True
            )
            raise IncorrectLookupParameters(error) from error


class PermittedActionsAdmin(admin.ModelAdmin):
    """A ModelAdmin whose actions each need a permission (see the module doc)."""

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        # Django lets an action that names no permission run for anyone who may see
        # the list. The changelist offers, and runs, only what this returns.
        actions = super().get_actions(request)
        if self.has_change_permission(request):
            return actions
        return {
            name: action
            for name, action in actions.items()
            if action and getattr(action[0], "allowed_permissions", None)
        }


def names_a_row(pk: Field, value: str) -> bool:
    """Whether `value`, as a changelist's checkbox sends it back, could be the
    primary key `pk` of a row: an integer key in ASCII digits that fits 64 bits
    (`row_id`), any other what the field reads and the database can hold."""
    while isinstance(pk, models.ForeignKey):  # a one-to-one key: its target's
        pk = pk.target_field
    if isinstance(pk, models.IntegerField):
        return row_id(value) is not None
    if "\x00" in value:  # no database text holds one (PostgreSQL refuses it)
        return False
    try:
        pk.to_python(value)
    except ValidationError:
        return False
    return True


# The most rows one action acts on in a request (see the module doc): each is its
# own transaction of a few statements, so this many take a few seconds.
ACTION_ROWS_MAX = 500


class SelectionCheckingAdmin(admin.ModelAdmin):
    """A ModelAdmin whose actions refuse a damaged selection, and one larger than
    `ACTION_ROWS_MAX` (see the module doc)."""

    action_rows_max = ACTION_ROWS_MAX

    def response_action(
        self, request: HttpRequest, queryset: QuerySet, *args: Any, **kwargs: Any
    ) -> HttpResponse | None:
        selected = request.POST.getlist(ACTION_CHECKBOX_NAME)
        # None: the changelist redirects to itself, with the message.
        if not all(names_a_row(self.opts.pk, value) for value in selected):
            self.message_user(
                request,
                gettext(
                    "The selection is damaged: it names something that is not a row "
                    "of this list. Nothing was done; select the rows again."
                ),
                messages.ERROR,
            )
            return None
        across = request.POST.get("select_across") == "1"
        count = queryset.count() if across else len(set(selected))
        if count > self.action_rows_max:
            self.message_user(
                request,
                gettext(
                    "%(count)d rows are selected; an action acts on at most "
                    "%(max)d at a time. Nothing was done: narrow the list with its "
                    "filters, or select fewer rows."
                )
                % {"count": count, "max": self.action_rows_max},
                messages.ERROR,
            )
            return None
        return super().response_action(request, queryset, *args, **kwargs)


class UniqueRaceAdmin(admin.ModelAdmin):
    """A ModelAdmin whose forms answer a unique value taken at the same instant by
    another request as they answer one taken before (see the module doc)."""

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except IntegrityError:
            if request.method != "POST":
                raise
            # Django's view ran in a transaction of its own, rolled back now; the
            # row that won the race has committed (PostgreSQL reports the conflict
            # only then), so the form's own unique check sees it this time.
            logger.warning(
                "admin form %s lost a race on a unique value; shown again",
                request.path,
                exc_info=True,
            )
            return super().changeform_view(request, object_id, form_url, extra_context)


class SiteAdmin(
    FilterRefusingAdmin,
    PermittedActionsAdmin,
    SelectionCheckingAdmin,
    UniqueRaceAdmin,
):
    """What the site puts on every admin registered on it."""

    paginator = EstimatedCountPaginator
    show_full_result_count = False


def for_the_site(admin_class: type[admin.ModelAdmin]) -> type[admin.ModelAdmin]:
    """`admin_class`, or a subclass of it that is a `SiteAdmin` (made as Django's
    own `register` makes a subclass for options it is given)."""
    if issubclass(admin_class, SiteAdmin):
        return admin_class
    return type(
        admin_class.__name__,
        (SiteAdmin, admin_class),
        {"__module__": admin_class.__module__},
    )


class AdminSite(admin.AdminSite):
    def register(
        self, model_or_iterable: Any, admin_class: Any = None, **options: Any
    ) -> None:
        admin_class = for_the_site(admin_class or admin.ModelAdmin)
        super().register(model_or_iterable, admin_class, **options)
