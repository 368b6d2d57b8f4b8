"""The admin site the back office runs on: Django's, with every list refusing a
filter in its address that it cannot apply, never with a 500.

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

The site puts these on every admin registered on it, Django's and other apps' too
(users, tokens, beat's schedules).
"""

import logging
from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.db import DatabaseError, transaction
from django.http import HttpRequest

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


class SiteAdmin(FilterRefusingAdmin, PermittedActionsAdmin):
    """What the site puts on every admin registered on it."""


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
