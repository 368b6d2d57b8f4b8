"""Leases in the database, timed by the database's clock.

A lease is a row `(name, holder, expires_at)` of `Lease`: who may act under a name
(a Snowflake worker id, the beat leader) and until when. It is acquired, renewed,
taken over and released by single statements whose times all come from the
database's clock: PostgreSQL's `clock_timestamp()`, never a host's clock, so a host
whose clock runs minutes fast cannot take a live lease early, and one that runs slow
cannot keep a dead one. (SQLite runs inside this process: its clock is this host's,
read here and passed in.) A lease is taken over only once it has expired; the
conditional `ON CONFLICT ... DO UPDATE ... WHERE expires_at < now` lets exactly one of
several takers win.

The holder's half of the bargain: it stops acting before `expires_at`. It cannot read
the database's clock, so it counts on its own steady clock from the moment it *sent*
the statement (the lease cannot have started earlier): `Lease.deadline`. The steady
clock is CLOCK_BOOTTIME where there is one, which keeps counting while the machine
is suspended; a process frozen (SIGSTOP, a paused VM) past its deadline finds it
passed when it wakes.

Statements go through a connection of the store's own, in autocommit: a lease must
not commit or roll back with whatever transaction the caller happens to be in.
"""

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from secrets import token_hex
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from .models import Lease as LeaseRow

logger = logging.getLogger(__name__)

_UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TABLE = LeaseRow._meta.db_table


def steady() -> float:
    """Seconds of a clock that never jumps and keeps counting during a suspend."""
    if hasattr(time, "CLOCK_BOOTTIME"):
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.monotonic()  # pragma: no cover  (not Linux)


def holder_name() -> str:
    """host:pid:token. The token makes every holder unique (pids are reused, and
    containers often share one); host and pid are there for the operator."""
    host = os.environ.get("HOSTNAME") or socket.gethostname()
    return f"{host[:150]}:{os.getpid()}:{token_hex(8)}"


def unix_ms(moment: datetime) -> int:
    """Whole milliseconds since the Unix epoch (rounded down), exactly."""
    return (moment - _UNIX_EPOCH) // timedelta(milliseconds=1)


@dataclass(frozen=True)
class Lease:
    """A lease this process holds, and when the database said so."""

    name: str
    holder: str
    expires_at: datetime  # the database's clock
    db_now: datetime  # the database's clock, read by the statement that set it
    sent: float  # `steady()` just before that statement was sent
    received: float  # `steady()` when its answer came back

    @property
    def deadline(self) -> float:
        """The `steady()` time at which the lease has certainly not yet expired: its
        length as the database measured it, counted from before the statement."""
        return self.sent + (self.expires_at - self.db_now).total_seconds()

    def db_clock_ms(self, at: float) -> int:
        """A lower bound of the database's clock at steady time `at`, in Unix ms.

        The database read `db_now` no later than our `received`, so counting from
        `received` never runs ahead of the database's clock.
        """
        return unix_ms(self.db_now) + int((at - self.received) * 1000)


class LeaseStore:
    """Acquire, renew and release leases over one connection of its own."""

    def __init__(self, alias: str = DEFAULT_DB_ALIAS) -> None:
        self._alias = alias
        self._lock = threading.Lock()
        self._db: BaseDatabaseWrapper | None = None

    def _execute(self, pg: str, sqlite: str, params: Any) -> tuple | None:
        """Run one statement (per vendor) in autocommit and return its first row.

        The store's own connection, opened with `connect()` and used through the
        backend's cursor: no atomic block of the caller's can take it in.
        """
        with self._lock:
            if self._db is None:
                self._db = connections.create_connection(self._alias)
                # The renewer thread and request threads take turns (under the lock).
                self._db.inc_thread_sharing()
            db = self._db
            try:
                with db.wrap_database_errors:
                    if db.connection is None:
                        db.connect()
                    cursor = db.create_cursor()
                    try:
                        sql = pg if db.vendor == "postgresql" else sqlite
                        cursor.execute(sql, params(db) if callable(params) else params)
                        return cursor.fetchone()
                    finally:
                        cursor.close()
            except Exception:
                self._close_locked()  # the next statement reconnects
                raise

    def _close_locked(self) -> None:
        db, self._db = self._db, None
        if db is not None and db.connection is not None:
            try:
                db.close()
            except Exception:  # already broken: nothing left to close
                logger.debug("closing the lease connection failed", exc_info=True)

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def forget(self) -> None:
        """In a forked child: drop the parent's connection without closing it (a
        close would end the parent's session on the server)."""
        self._lock = threading.Lock()
        self._db = None

    def acquire(
        self, names: Sequence[str], *, seconds: float, attempts: int = 10
    ) -> Lease | None:
        """One of `names` that is free or whose lease expired; None if all are held.

        A random free name is tried, so that many processes starting at once rarely
        want the same one; the loser of such a race tries again.
        """
        holder = holder_name()
        for _ in range(attempts):
            sent = steady()
            row = self._execute(
                _ACQUIRE_PG, _ACQUIRE_SQLITE, _acquire_params(names, holder, seconds)
            )
            received = steady()
            if row is not None:
                name, expires_at, db_now = row
                return Lease(
                    name,
                    holder,
                    _aware(expires_at),
                    _aware(db_now),
                    sent,
                    received,
                )
            if not self._any_free(names):
                return None
        return None

    def _any_free(self, names: Sequence[str]) -> bool:
        row = self._execute(
            f"SELECT count(*) FROM {_TABLE} "  # noqa: S608
            "WHERE name = ANY(%s) AND expires_at >= clock_timestamp()",
            f"SELECT count(*) FROM {_TABLE} "  # noqa: S608
            "WHERE name IN (SELECT value FROM json_each(%s)) AND expires_at >= %s",
            lambda db: (
                [list(names)]
                if db.vendor == "postgresql"
                else [_json(names), _text(db, timezone.now())]
            ),
        )
        return row is not None and row[0] < len(names)

    def renew(self, lease: Lease, *, seconds: float) -> Lease | None:
        """The same lease for `seconds` more; None if it is no longer ours (it
        expired and was taken over, or it was released)."""
        sent = steady()
        now = timezone.now()
        row = self._execute(
            f"UPDATE {_TABLE} SET expires_at = clock_timestamp() + %s "  # noqa: S608
            "WHERE name = %s AND holder = %s AND expires_at > clock_timestamp() "
            "RETURNING expires_at, clock_timestamp()",
            f"UPDATE {_TABLE} SET expires_at = %s "  # noqa: S608
            "WHERE name = %s AND holder = %s AND expires_at > %s "
            "RETURNING expires_at, %s",
            lambda db: (
                [timedelta(seconds=seconds), lease.name, lease.holder]
                if db.vendor == "postgresql"
                else [
                    _text(db, now + timedelta(seconds=seconds)),
                    lease.name,
                    lease.holder,
                    _text(db, now),
                    _text(db, now),
                ]
            ),
        )
        if row is None:
            return None
        expires_at, db_now = row
        return Lease(
            lease.name,
            lease.holder,
            _aware(expires_at),
            _aware(db_now),
            sent,
            steady(),
        )

    def release(self, lease: Lease) -> None:
        """End our lease now, so that another process may take it at once."""
        self._execute(
            f"UPDATE {_TABLE} SET expires_at = clock_timestamp() "  # noqa: S608
            "WHERE name = %s AND holder = %s AND expires_at > clock_timestamp() "
            "RETURNING name",
            f"UPDATE {_TABLE} SET expires_at = %s "  # noqa: S608
            "WHERE name = %s AND holder = %s AND expires_at > %s RETURNING name",
            lambda db: (
                [lease.name, lease.holder]
                if db.vendor == "postgresql"
                else [
                    _text(db, timezone.now()),
                    lease.name,
                    lease.holder,
                    _text(db, timezone.now()),
                ]
            ),
        )


# Pick a random name that is free (no row) or expired, and insert or take it over in
# the same statement. The conflict clause re-checks the expiry on the row as it is
# when the statement gets its lock, so two takers of one name cannot both win.
_ACQUIRE_PG = f"""
INSERT INTO {_TABLE} (name, holder, acquired_at, expires_at)
SELECT candidate, %s, clock_timestamp(), clock_timestamp() + %s
FROM unnest(%s::text[]) AS candidate
WHERE NOT EXISTS (
    SELECT 1 FROM {_TABLE} held
    WHERE held.name = candidate AND held.expires_at >= clock_timestamp()
)
ORDER BY random() LIMIT 1
ON CONFLICT (name) DO UPDATE
SET holder = EXCLUDED.holder, acquired_at = EXCLUDED.acquired_at,
    expires_at = EXCLUDED.expires_at
WHERE {_TABLE}.expires_at < clock_timestamp()
RETURNING name, expires_at, clock_timestamp()
"""  # noqa: S608
_ACQUIRE_SQLITE = f"""
INSERT INTO {_TABLE} (name, holder, acquired_at, expires_at)
SELECT value, %s, %s, %s FROM json_each(%s)
WHERE NOT EXISTS (
    SELECT 1 FROM {_TABLE} held WHERE held.name = value AND held.expires_at >= %s
)
ORDER BY random() LIMIT 1
ON CONFLICT (name) DO UPDATE
SET holder = excluded.holder, acquired_at = excluded.acquired_at,
    expires_at = excluded.expires_at
WHERE {_TABLE}.expires_at < excluded.acquired_at
RETURNING name, expires_at, acquired_at
"""  # noqa: S608


def _acquire_params(names: Sequence[str], holder: str, seconds: float) -> Any:
    def params(db: BaseDatabaseWrapper) -> list:
        if db.vendor == "postgresql":
            return [holder, timedelta(seconds=seconds), list(names)]
        now = timezone.now()
        return [
            holder,
            _text(db, now),
            _text(db, now + timedelta(seconds=seconds)),
            _json(names),
            _text(db, now),
        ]

    return params


def _json(names: Sequence[str]) -> str:
    return json.dumps(list(names))


def _text(db: BaseDatabaseWrapper, moment: datetime) -> str:
    """A time as SQLite stores a DateTimeField (so that texts compare as times)."""
    return str(db.ops.adapt_datetimefield_value(moment))


def _aware(value: datetime | str) -> datetime:
    if isinstance(value, str):  # SQLite
        parsed = parse_datetime(value)
        if parsed is None:
            raise ValueError(f"not a time: {value!r}")
        value = parsed
    if timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    return value
