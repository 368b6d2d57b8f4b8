"""SQL patterns the hot path and the housekeeping share.

`insert_unless_exists`: claiming something once (a key record, a ledger reference) is
an INSERT that may lose to a row that is already there. Django's way, `create()` inside
`atomic()` catching `IntegrityError`, costs a savepoint and its release around the
INSERT (three round trips) and an exception on the common losing path. `INSERT ... ON
CONFLICT DO NOTHING` costs one statement, works the same on PostgreSQL and SQLite, and
losing is an answer, not an exception.

`insert_many`: a batch writes many rows of one model (a batch of 100 transfers: 100
journal entries, 200 postings, 100 transfers). One INSERT whose every column is an
array (`SELECT * FROM unnest(...)`) has one text whatever the batch's size, and its
values go as they are: `bulk_create` prepares each one through its field first (2,500
calls for those 400 rows, a third of the request's CPU).

`delete_in_batches`: housekeeping that deletes old rows (expired keys, unused
pre-orders) must never lock a large part of a table or hold locks for long, or it
starves the writers it shares the table with.

`DatabaseNow`: times that decide who may act (leases, take-overs, expiry) come from
the database's clock, never a host's: hosts' clocks disagree, the database's is one.
On PostgreSQL it is `statement_timestamp()` (when the statement started, not the
transaction), put into the statements that run anyway; not `clock_timestamp()`,
which is volatile: a condition on it cannot use an index, so `expires_at <
clock_timestamp()` reads the whole table to find a few expired rows. SQLite runs inside
this process: its clock is this host's, read here and passed in, formatted as the
ORM formats it (so that times stored both ways compare, and equal, as text).
"""

import json
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from functools import cache
from typing import Any, TypeVar, cast

from django.db import connection, transaction
from django.db.models import (
    DateTimeField,
    Expression,
    Field,
    JSONField,
    Model,
    QuerySet,
)
from django.db.models.functions import Now
from django.utils import timezone


class DatabaseNow(Expression):
    """The database's clock, plus `plus`, as an ORM expression (see the module doc).

    `Record.objects.filter(locked_until__lt=DatabaseNow())`,
    `.update(expires_at=DatabaseNow(plus=ttl))`.
    """

    output_field = DateTimeField()

    def __init__(self, plus: timedelta = timedelta(0)) -> None:
        super().__init__()
        self.plus = plus

    def as_sql(self, compiler: Any, connection: Any) -> Any:
        if connection.vendor == "postgresql":
            return "(STATEMENT_TIMESTAMP() + %s)", (self.plus,)
        moment = timezone.now() + self.plus
        return "%s", (connection.ops.adapt_datetimefield_value(moment),)


@cache
def _columns(model: type[Model]) -> list[Field]:
    return [f for f in model._meta.concrete_fields if not f.primary_key]


@cache
def _statement(
    model: type[Model], conflict: tuple[str, ...], vendor: str, clocked: tuple[str, ...]
) -> str:
    """Built once per model, vendor and clocked columns; only model metadata is
    formatted in."""
    quote = connection.ops.quote_name
    columns = ", ".join(quote(cast(str, f.column)) for f in _columns(model))
    placeholders = ", ".join(
        "(CLOCK_TIMESTAMP() + %s)" if f.attname in clocked else "%s"
        for f in _columns(model)
    )
    target = ", ".join(quote(c) for c in conflict)
    returning = ", ".join(
        quote(cast(str, getattr(f, "column", None)))
        for f in [model._meta.pk, *(model._meta.get_field(n) for n in clocked)]
    )
    return (
        f"INSERT INTO {quote(model._meta.db_table)} ({columns}) "  # noqa: S608
        f"VALUES ({placeholders}) ON CONFLICT ({target}) DO NOTHING "
        f"RETURNING {returning}"
    )


def insert_unless_exists(
    instance: Model,
    conflict: Sequence[str],
    *,
    clock: Mapping[str, timedelta] | None = None,
) -> bool:
    """INSERT `instance` unless a row with the same `conflict` columns exists.

    True (and `instance.pk` set) if the row is ours; False if one was there first.
    Field defaults and `auto_now_add` apply as in `save()`. Each column named in
    `clock`, and each whose default is the database's clock (`db_default=Now()`), is
    set to the database's clock plus its offset instead (`DatabaseNow`), and the
    instance gets the values the database chose.
    """
    model = type(instance)
    # A column stamped by the database (`db_default=Now()`) is its clock too.
    clock = {
        **{
            f.attname: timedelta(0)
            for f in _columns(model)
            if isinstance(f.db_default, Now)
        },
        **(clock or {}),
    }
    postgres = connection.vendor == "postgresql"
    if not postgres:  # SQLite: this host's clock is the database's
        now = timezone.now()
        for name, plus in clock.items():
            setattr(instance, name, now + plus)
    clocked = tuple(clock) if postgres else ()
    values: list[Any] = [
        clock[f.attname]
        if f.attname in clocked
        else f.get_db_prep_save(f.pre_save(instance, True), connection)
        for f in _columns(model)
    ]
    with connection.cursor() as cursor:
        sql = _statement(model, tuple(conflict), connection.vendor, clocked)
        cursor.execute(sql, values)
        row = cursor.fetchone()
    if row is None:
        return False
    instance.pk = row[0]
    for name, value in zip(clocked, row[1:], strict=True):
        setattr(instance, name, value)
    instance._state.adding = False
    return True


M = TypeVar("M", bound=Model)


@cache
def _unnest_statement(model: type[Model]) -> str:
    """Built once per model: one array per column, each cast to its column's type."""
    quote = connection.ops.quote_name
    fields = _columns(model)
    columns = ", ".join(quote(cast(str, f.column)) for f in fields)
    arrays = ", ".join(
        # (a length dropped: varchar(3) -> varchar[])
        f"%s::{cast(str, f.db_type(connection)).split('(')[0]}[]"
        for f in fields
    )
    return (
        f"INSERT INTO {quote(model._meta.db_table)} ({columns}) "  # noqa: S608
        f"SELECT * FROM unnest({arrays}) "
        f"RETURNING {quote(cast(str, model._meta.pk.column))}"  # type: ignore[union-attr]
    )


def insert_many(objs: Sequence[M]) -> Sequence[M]:
    """`bulk_create(objs)` for new rows of one model, as one INSERT of arrays on
    PostgreSQL (see the module doc): each instance gets its primary key, and its
    `auto_now_add` fields one time for the batch. Each value must be what its
    column stores already (an int, a str, an aware datetime; a JSON field's value
    is encoded here): nothing else is converted. Other databases: `bulk_create`.
    """
    if not objs:
        return objs
    model = type(objs[0])
    if connection.vendor != "postgresql":
        return model._default_manager.bulk_create(objs)
    now = timezone.now()
    arrays: list[list[Any]] = []
    for f in _columns(model):
        if getattr(f, "auto_now_add", False) or getattr(f, "auto_now", False):
            for obj in objs:
                setattr(obj, f.attname, now)
        values = [getattr(obj, f.attname) for obj in objs]
        if isinstance(f, JSONField):  # (None is SQL NULL, as `bulk_create` has it)
            values = [
                None if value is None else json.dumps(value, cls=f.encoder)
                for value in values
            ]
        arrays.append(values)
    with connection.cursor() as cursor:
        cursor.execute(_unnest_statement(model), arrays)
        ids = [row[0] for row in cursor.fetchall()]
    for obj, pk in zip(objs, ids, strict=True):
        obj.pk = pk
        obj._state.adding, obj._state.db = False, connection.alias
    return objs


def delete_in_batches(
    rows: QuerySet,
    *,
    batch_size: int = 1000,
    max_seconds: float = 30.0,
    rest: float = 1.0,
) -> int:
    """Delete `rows` in small batches; return how many went.

    Each batch is its own short transaction that deletes rows picked by primary key
    and re-checks `rows`' conditions as it deletes (a row may have changed since it
    was picked). Batches walk the primary key upwards, each starting after the last
    one's highest key, so none scans again the dead rows its predecessors left in the
    index (until vacuum clears them, each would cost more than the one before). After
    each batch it rests `rest` times as long as the batch took, a second at most:
    the writers sharing the table, its WAL and the cores get them back (0: no rest).
    It stops after `max_seconds`; the next run carries on (from the lowest key again,
    so rows that expired behind the walk go too).

    On PostgreSQL a batch commits without waiting for its WAL to reach the disk
    (`synchronous_commit = off`, for that transaction only): the writers' commits
    then share fewer flushes with it. A crash may undo the last batches; their rows
    are as old as they were and go in the next run. Not inside a caller's
    transaction (an `atomic()` or autocommit turned off), whose own writes would
    commit the same way.
    """
    asynchronous = (
        connection.vendor == "postgresql"
        and connection.get_autocommit()
        and not connection.in_atomic_block
    )
    deleted, after = 0, None
    deadline = time.monotonic() + max_seconds
    while time.monotonic() < deadline:
        began = time.monotonic()
        picked = rows if after is None else rows.filter(pk__gt=after)
        with transaction.atomic():
            if asynchronous:
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL synchronous_commit = off")
            ids = list(picked.order_by("pk").values_list("pk", flat=True)[:batch_size])
            if not ids:
                break
            count, _ = rows.filter(pk__in=ids).delete()
        deleted, after = deleted + count, ids[-1]
        if len(ids) < batch_size:
            break
        if rest > 0:
            time.sleep(min((time.monotonic() - began) * rest, 1.0))
    return deleted
