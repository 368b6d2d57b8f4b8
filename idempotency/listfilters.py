"""Admin list filters and counts that stay cheap on tables of millions of rows.

Django's filter on a plain column (`list_filter = ("endpoint",)`) finds its choices
with `SELECT DISTINCT endpoint ... ORDER BY endpoint` over the whole table, on every
page view: seconds on the idempotency records. A `ValuesFilter` offers the values
its code knows instead (the currencies the ledger holds, the endpoints declared with
`@idempotent`), and applies only those, so a value in the address that is none of
them is ignored as Django ignores any choice it does not offer.

Each changelist also counted its whole table twice (the paginator's count and the
"N total" beside a filtered count). `EstimatedCountPaginator` reads an unfiltered
list's size from PostgreSQL's own estimate (`pg_class.reltuples`, kept by ANALYZE)
once the table is large, and counts exactly otherwise; the admin site sets
`show_full_result_count = False` with it (ledger.adminsite).
"""

from collections.abc import Iterable
from typing import Any, ClassVar

from django.contrib import admin
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.functional import cached_property


class ValuesFilter(admin.SimpleListFilter):
    """A filter on `field` offering `values()`: (value, label) pairs from code, never
    from the table."""

    field: ClassVar[str]

    def values(self) -> Iterable[tuple[str, Any]]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list:
        return list(self.values())

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() in {value for value, _ in self.values()}:
            return queryset.filter(**{self.field: self.value()})
        return queryset


def table_estimate(queryset: QuerySet) -> int:
    """PostgreSQL's estimate of the rows in `queryset`'s table (-1: never analyzed)."""
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)",
            [connections[queryset.db].ops.quote_name(queryset.model._meta.db_table)],
        )
        row = cursor.fetchone()
    return row[0] if row else -1


class EstimatedCountPaginator(Paginator):
    """Count an unfiltered list by the table's estimate once it holds at least
    `exact_below` rows (on PostgreSQL), exactly otherwise: a filtered list, a small
    table, SQLite. The last pages of an estimated list may be a little off, which an
    admin reader can live with; a count of millions of rows on every page view is
    seconds."""

    exact_below = 10_000

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if (
            isinstance(queryset, QuerySet)
            and not queryset.query.where
            and connections[queryset.db].vendor == "postgresql"
        ):
            estimate = table_estimate(queryset)
            if estimate >= self.exact_below:
                return estimate
        return super().count
