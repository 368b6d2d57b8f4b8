"""Two SQL patterns the hot path and the housekeeping share.

`insert_unless_exists`: claiming something once (a key record, a ledger reference) is
an INSERT that may lose to a row that is already there. Django's way, `create()` inside
`atomic()` catching `IntegrityError`, costs a savepoint and its release around the
INSERT (three round trips) and an exception on the common losing path. `INSERT ... ON
CONFLICT DO NOTHING` costs one statement, works the same on PostgreSQL and SQLite, and
losing is an answer, not an exception.

`delete_in_batches`: housekeeping that deletes old rows (expired keys, unused
pre-orders) must never lock a large part of a table or hold locks for long, or it
starves the writers it shares the table with.
"""

import time
from collections.abc import Sequence
from functools import cache
from typing import cast

from django.db import connection, transaction
from django.db.models import Field, Model, QuerySet


@cache
def _columns(model: type[Model]) -> list[Field]:
    return [f for f in model._meta.concrete_fields if not f.primary_key]


@cache
def _statement(model: type[Model], conflict: tuple[str, ...], vendor: str) -> str:
    """Built once per model and vendor; only model metadata is formatted in."""
    quote = connection.ops.quote_name
    columns = ", ".join(quote(cast(str, f.column)) for f in _columns(model))
    placeholders = ", ".join(["%s"] * len(_columns(model)))
    target = ", ".join(quote(c) for c in conflict)
    pk = quote(cast(str, model._meta.pk.column))  # type: ignore[union-attr]
    return (
        f"INSERT INTO {quote(model._meta.db_table)} ({columns}) "  # noqa: S608
        f"VALUES ({placeholders}) ON CONFLICT ({target}) DO NOTHING RETURNING {pk}"
    )


def insert_unless_exists(instance: Model, conflict: Sequence[str]) -> bool:
    """INSERT `instance` unless a row with the same `conflict` columns exists.

    True (and `instance.pk` set) if the row is ours; False if one was there first.
    Field defaults and `auto_now_add` apply as in `save()`.
    """
    model = type(instance)
    values = [
        f.get_db_prep_save(f.pre_save(instance, True), connection)
        for f in _columns(model)
    ]
    with connection.cursor() as cursor:
        cursor.execute(_statement(model, tuple(conflict), connection.vendor), values)
        row = cursor.fetchone()
    if row is None:
        return False
    instance.pk = row[0]
    instance._state.adding = False
    return True


def delete_in_batches(
    rows: QuerySet, *, batch_size: int = 1000, max_seconds: float = 30.0
) -> int:
    """Delete `rows` in small batches; return how many went.

    Each batch is its own short transaction that deletes rows picked by primary key
    and re-checks `rows`' conditions as it deletes (a row may have changed since it
    was picked). It stops after `max_seconds`; the next run carries on.
    """
    deleted = 0
    deadline = time.monotonic() + max_seconds
    while time.monotonic() < deadline:
        with transaction.atomic():
            ids = list(rows.order_by("pk").values_list("pk", flat=True)[:batch_size])
            if not ids:
                break
            count, _ = rows.filter(pk__in=ids).delete()
        deleted += count
        if len(ids) < batch_size:
            break
    return deleted
