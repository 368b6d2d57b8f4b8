"""Keyset pagination for the shop's lists (newest first, as the API's cursors).

A page is named by the id it starts after (`?before=<id>`: older rows) or before
(`?after=<id>`: newer rows), never by a page number, so a row added while someone
pages through does not shift every page by one, and the database seeks straight to
the page by its primary key instead of counting and skipping rows.
"""

from dataclasses import dataclass
from typing import Any

from django.db.models import Model, QuerySet
from django.http import QueryDict

from ledger.forms import row_id

PAGE_SIZE = 20


@dataclass
class Page:
    items: list[Any]
    newer: int | None = None  # `?after=` for the page of newer rows
    older: int | None = None  # `?before=` for the page of older rows

    @property
    def is_first(self) -> bool:
        return self.newer is None

    @property
    def has_other_pages(self) -> bool:
        return self.newer is not None or self.older is not None


def keyset_page(
    queryset: QuerySet[Model], query: QueryDict, *, size: int = PAGE_SIZE
) -> Page:
    """The page of `queryset` (newest first by primary key) that `query` names."""
    after = row_id(query.get("after"))  # None: the first page
    if after is not None:
        rows = list(queryset.filter(pk__gt=after).order_by("pk")[: size + 1])
        if len(rows) > size:  # still newer rows above this page
            items = rows[:size][::-1]
            return Page(
                items,
                newer=items[0].pk,
                older=items[-1].pk
                if queryset.filter(pk__lt=items[-1].pk).exists()
                else None,
            )
        # Back at the top: that is the first page, full, whatever `after` said.
    before = row_id(query.get("before")) if after is None else None
    rows_query = queryset if before is None else queryset.filter(pk__lt=before)
    rows = list(rows_query.order_by("-pk")[: size + 1])
    items = rows[:size]
    newer = None
    if before is not None and items and queryset.filter(pk__gt=items[0].pk).exists():
        newer = items[0].pk
    older = items[-1].pk if len(rows) > size else None
    return Page(items, newer=newer, older=older)
