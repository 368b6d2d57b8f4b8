"""Bulk data for the overhead benchmark, and the key lookup's own time. Plain psycopg
(every connection in autocommit), no Django.

Rows are made as copies of a real row that the app itself wrote, with only the
columns that must differ changed, by one `INSERT ... SELECT` over `generate_series`
per million: the loader keeps working whatever columns the app adds or stores, and a
million rows take seconds. Loaded key records have 32 random-looking hex digits as
keys (md5 of the row number), like the UUIDs clients send, over a thousand scopes,
so the unique index grows the way real traffic grows it.
"""

import random
import statistics
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

KEYS = "idempotency_idempotencyrecord"
CHUNK = 1_000_000

# The key lookup of the corrected design (and of the floor, bench/contenders.py): the
# advisory lock that serialises requests with one key, taken in the same statement
# as the lookup of the key's record. Named parameters: scope, key.
KEY_LOOKUP = f"""
SELECT pg_advisory_xact_lock(hashtextextended(%(scope)s || ' ' || %(key)s, 0)),
       (SELECT id FROM {KEYS} WHERE scope = %(scope)s AND key = %(key)s)
"""  # noqa: S608 (a constant table name)


def scalar(conn: psycopg.Connection, sql: str, params: Sequence | Mapping = ()) -> Any:
    """The first column of the statement's one row."""
    row = conn.execute(sql, params).fetchone()
    if row is None:
        raise RuntimeError(f"no row from {sql}")
    return row[0]


def _columns(conn: psycopg.Connection, table: str) -> list[str]:
    found = conn.execute(
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_name = %s AND column_name <> 'id' ORDER BY ordinal_position",
        [table],
    ).fetchall()
    return [row[0] for row in found]


def copy_rows(
    conn: psycopg.Connection,
    table: str,
    template: int,
    count: int,
    made: dict[str, str],
) -> None:
    """Insert `count` copies of row `template` of `table`, each column in `made`
    computed by its SQL expression instead (`g` is the copy's number, from 1; a
    literal % is written %%, as the statement has parameters)."""
    columns = _columns(conn, table)
    values = ", ".join(made.get(c, f't."{c}"') for c in columns)
    names = ", ".join(f'"{c}"' for c in columns)
    for first in range(1, count + 1, CHUNK):
        with conn.transaction():
            conn.execute(
                f"INSERT INTO {table} ({names}) SELECT {values}"  # noqa: S608
                f" FROM {table} t, generate_series(%s::bigint, %s) g WHERE t.id = %s",
                [first, min(count, first + CHUNK - 1), template],
            )


def key_records(conn: psycopg.Connection) -> int:
    return scalar(conn, f"SELECT count(*) FROM {KEYS}")  # noqa: S608


def load_keys(conn: psycopg.Connection, count: int, *, expired: bool = False) -> float:
    """Add `count` copies of the newest finished key record, live (expiring in a day)
    or expired a day ago; VACUUM ANALYZE the table and CHECKPOINT (so that neither
    autovacuum nor the flushing of the load's pages weighs on the measurements that
    follow) and return the seconds it all took."""
    started = time.monotonic()
    template = scalar(
        conn,
        f"SELECT max(id) FROM {KEYS} WHERE status <> 'processing'",  # noqa: S608
    )
    if template is None:
        raise RuntimeError("no finished key record to copy")
    batch = uuid.uuid4().hex[:8]  # keys of separate loads never collide
    when = "- interval '1 day'" if expired else "+ interval '1 day'"
    copy_rows(
        conn,
        KEYS,
        template,
        count,
        {
            "scope": "'user:' || (1000000 + g %% 1000)",
            "key": f"'{batch}-' || md5(g::text)",
            "created_at": f"now() {when} - interval '1 day'",
            "expires_at": f"now() {when}",
        },
    )
    conn.execute(f"VACUUM (ANALYZE) {KEYS}")
    conn.execute("CHECKPOINT")
    return time.monotonic() - started


def _explain(conn: psycopg.Connection, scope: str, key: str) -> tuple[float, int, int]:
    """One lookup: (execution ms, shared buffers hit, shared buffers read)."""
    plan = scalar(
        conn,
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + KEY_LOOKUP,
        {"scope": scope, "key": key},
    )[0]
    top = plan["Plan"]  # its buffer counts include its children's (the InitPlan)
    return (
        plan["Execution Time"],
        top.get("Shared Hit Blocks", 0),
        top.get("Shared Read Blocks", 0),
    )


def lookup(conn: psycopg.Connection, probes: int) -> dict:
    """The key lookup, `probes` times for new keys (a first execution's lookup, which
    finds nothing) and `probes` times for keys that exist (a retry's): the median
    execution time in ms and the median shared buffers hit and read."""
    share = min(100.0, 100.0 * probes * 20 / max(key_records(conn), 1))
    known = conn.execute(
        f"SELECT scope, key FROM {KEYS} TABLESAMPLE SYSTEM (%s) LIMIT %s",  # noqa: S608
        [share, probes],
    ).fetchall()
    random.shuffle(known)
    new = [("user:1000000", uuid.uuid4().hex) for _ in range(probes)]
    figures = {}
    for name, pairs in (("new", new), ("known", known)):
        measured = [_explain(conn, scope, key) for scope, key in pairs]
        figures[f"{name}_ms"] = round(statistics.median(m[0] for m in measured), 4)
        figures[f"{name}_hit"] = statistics.median(m[1] for m in measured)
        figures[f"{name}_read"] = statistics.median(m[2] for m in measured)
    return figures
