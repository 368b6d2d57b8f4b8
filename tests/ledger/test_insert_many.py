"""`idempotency.sql.insert_many` writes the rows `bulk_create` would write."""

import pytest

from idempotency.sql import insert_many
from ledger.models import JournalEntry

pytestmark = pytest.mark.django_db

COLUMNS = ("reference", "kind", "currency", "description", "params")


def entries(prefix: str) -> list[JournalEntry]:
    return [
        JournalEntry(
            reference=f"{prefix}:{n}",
            kind=JournalEntry.Kind.TRANSFER,
            currency="CNY",
            description=f"Entry {n} ✓",
            params={"n": n, "text": '茶 "quoted"'} if n % 2 else {},
        )
        for n in range(5)
    ]


def test_insert_many_writes_what_bulk_create_writes():
    ours = insert_many(entries("many"))
    theirs = JournalEntry.objects.bulk_create(entries("bulk"))
    assert all(entry.pk is not None and not entry._state.adding for entry in ours)
    stored = {
        entry.reference: entry
        for entry in JournalEntry.objects.filter(pk__in=[e.pk for e in ours + theirs])
    }
    for mine, other in zip(ours, theirs, strict=True):
        row, expected = stored[mine.reference], stored[other.reference]
        assert row.pk == mine.pk and row.created_at == mine.created_at
        for column in COLUMNS[1:]:
            assert getattr(row, column) == getattr(expected, column), column


def test_insert_many_of_nothing_writes_nothing(django_assert_num_queries):
    with django_assert_num_queries(0):
        assert insert_many([]) == []
