"""The admin site the back office runs on: Django's, with every list's filters
checked whole before its page is drawn.

Django refuses a filter in a list's address that it cannot apply (`?e=1`, a
"database error" page) while it builds the list's query, but two bad values only
fail later, when the query is compiled, as a 500: a year past 9999
(`?created_at__year=99999`, whose bounds are computed then), and on a list with a
date hierarchy the year 9999 itself (the next year is its upper bound). Every list
on this site compiles its query once more while Django can still refuse it, so
those get the same refusal as any other bad filter. The site wraps every admin
registered on it, Django's and other apps' too (users, tokens, beat's schedules).
"""

import contextlib
from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import EmptyResultSet, FullResultSet
from django.db.models import QuerySet
from django.http import HttpRequest


class CheckedChangeList(ChangeList):
    def get_queryset(
        self, request: HttpRequest, exclude_parameters: Any = None
    ) -> QuerySet:
        try:
            queryset = super().get_queryset(request, exclude_parameters)
            _compile(queryset)
        except (ValueError, OverflowError) as error:
            raise IncorrectLookupParameters(error) from error
        return queryset


def _compile(queryset: QuerySet) -> None:
    # (A query that matches nothing or everything is a query.)
    with contextlib.suppress(EmptyResultSet, FullResultSet):
        queryset.query.get_compiler(queryset.db).as_sql()


class CheckedLists:
    """A ModelAdmin whose list is a `CheckedChangeList`."""

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return CheckedChangeList


class AdminSite(admin.AdminSite):
    def register(
        self, model_or_iterable: Any, admin_class: Any = None, **options: Any
    ) -> None:
        admin_class = admin_class or admin.ModelAdmin
        if not issubclass(admin_class, CheckedLists):
            admin_class = type(
                admin_class.__name__,
                (CheckedLists, admin_class),
                {"__module__": admin_class.__module__},
            )
        super().register(model_or_iterable, admin_class, **options)
