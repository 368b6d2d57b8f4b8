import sys
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections

from idempotency.snowflake import forget_worker_lease
from tests import reaper
from tests.factories import UserFactory
from tests.servers import OwnRedis


def pytest_configure(config: pytest.Config) -> None:
    if not _xdist_controller(config):
        reaper.start()
    _empty_tables_by_delete()


def _xdist_controller(config: pytest.Config) -> bool:
    """Is this the pytest-xdist process that hands the tests to its workers (`make
    test`: `-n 2`)? It runs none and starts nothing but the workers, which are
    processes of its own until the end: each worker watches what its tests start."""
    return bool(config.getoption("numprocesses", None)) and not hasattr(
        config, "workerinput"
    )


def _empty_tables_by_delete() -> None:
    """After each transactional test (`transaction=True`, `live_server`), empty the
    tables with DELETE instead of Django's TRUNCATE, on PostgreSQL.

    TRUNCATE makes new files for every table and index: about 0.5-1 s for our 39
    tables, paid by over 200 tests. A DELETE of the few rows a test wrote takes
    milliseconds. Triggers are off for the transaction (`session_replication_role`):
    the ledger's append-only triggers refuse a DELETE (they ignore TRUNCATE), and the
    foreign keys are checked by triggers too (every table ends empty). That needs a
    superuser (the README's `postgres`); any other role keeps TRUNCATE. Only this
    process flushes: the servers the tests start are untouched.

    The content types and permissions stay: the flush's post_migrate signal made
    the same rows again (`create_permissions`, some 150 INSERTs, and some 70 reads:
    most of a flush's time). After such a flush the signal goes to every receiver
    but those two makers (the worker id lease is still forgotten). The tables that
    grant permissions (users', groups') are emptied as before.
    """
    from django.contrib.auth.management import create_permissions
    from django.contrib.contenttypes.management import create_contenttypes
    from django.core.management.commands import flush
    from django.core.management.sql import emit_post_migrate_signal
    from django.db.backends.postgresql.operations import DatabaseOperations
    from django.db.models.signals import post_migrate

    truncate = DatabaseOperations.sql_flush
    kept = {"django_content_type", "auth_permission"}
    kept_by: set[str] = set()  # the aliases whose last flush kept them
    auth_uid = "django.contrib.auth.management.create_permissions"  # auth's apps.py
    superuser: dict[str, bool] = {}

    def is_superuser(ops: DatabaseOperations) -> bool:
        alias = ops.connection.alias
        if alias not in superuser:
            with ops.connection.cursor() as cursor:
                cursor.execute(
                    "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
                )
                row = cursor.fetchone()
            superuser[alias] = bool(row and row[0])
        return superuser[alias]

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if not tables or reset_sequences or not is_superuser(self):
            return truncate(
                self,
                style,
                tables,
                reset_sequences=reset_sequences,
                allow_cascade=allow_cascade,
            )
        kept_by.add(self.connection.alias)
        # flush runs these in one transaction: SET LOCAL ends with it.
        return [
            "SET LOCAL session_replication_role = replica",
            *(
                f"{style.SQL_KEYWORD('DELETE FROM')} "
                f"{style.SQL_FIELD(self.quote_name(table))};"
                for table in tables
                if table not in kept
            ),
        ]

    def emit_after_flush(verbosity: int, interactive: bool, db: str, **kwargs) -> None:
        if db not in kept_by:
            emit_post_migrate_signal(verbosity, interactive, db, **kwargs)
            return
        kept_by.discard(db)
        post_migrate.disconnect(create_permissions, dispatch_uid=auth_uid)
        post_migrate.disconnect(create_contenttypes)
        try:
            emit_post_migrate_signal(verbosity, interactive, db, **kwargs)
        finally:
            post_migrate.connect(create_contenttypes)
            post_migrate.connect(create_permissions, dispatch_uid=auth_uid)

    DatabaseOperations.sql_flush = sql_flush  # type: ignore[method-assign]
    flush.emit_post_migrate_signal = emit_after_flush  # type: ignore[attr-defined]


@pytest.hookimpl(trylast=True)  # after pytest has torn down the session's fixtures
def pytest_sessionfinish(session: pytest.Session) -> None:
    """A process a test started and left running fails the run (`tests.reaper`)."""
    if left := reaper.stragglers():
        lines = "\n".join(f"  {process}" for process in left)
        sys.stderr.write(f"\nprocesses the tests left running (killed now):\n{lines}\n")
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def run_in_threads(count: int, work: Callable[[int], Any]) -> list[Any]:
    """Run `work(i)` in `count` real threads released at the same instant.

    Each thread has its own database connection (closed at the end), so the races are
    between real transactions. Returns each thread's result, or the exception it
    raised, in thread order.
    """
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def target(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = work(i)
        except Exception as exc:
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return results


class Background(threading.Thread):
    """`work()` in a thread with its own database connection; `.result` after join."""

    def __init__(self, work: Callable[[], Any]) -> None:
        super().__init__()
        self.work = work
        self.result: Any = None

    def run(self) -> None:
        try:
            self.result = self.work()
        except Exception as exc:
            self.result = exc
        finally:
            connections.close_all()

    def outcome(self) -> Any:
        self.join(timeout=60)
        assert not self.is_alive(), "the request hung"
        return self.result


@pytest.fixture
def on_postgres() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL")


@pytest.fixture
def host_clock(monkeypatch) -> Callable[[timedelta], None]:
    """`host_clock(skew)` sets this host's clock (`django.utils.timezone.now`, as the
    code reads it) `skew` away from the database's, which is left alone. PostgreSQL
    only: on SQLite the database's clock is this host's."""
    from django.utils import timezone

    if connection.vendor != "postgresql":
        pytest.skip("on SQLite the database's clock is this host's")
    real_now = timezone.now

    def skew(by: timedelta) -> None:
        monkeypatch.setattr("django.utils.timezone.now", lambda: real_now() + by)

    return skew


@pytest.fixture
def user(db):
    return UserFactory()


@pytest.fixture(autouse=True)
def _fresh_redis(settings):
    """Every test starts with an empty Redis database of its own (the cache of
    replayed responses must not leak between tests)."""
    from idempotency.redis import get_redis

    client = get_redis()
    if client is not None:
        client.flushdb()


@pytest.fixture
def own_redis(settings) -> Iterator[OwnRedis]:
    redis = OwnRedis()
    redis.start()
    settings.REDIS_URL = redis.url
    try:
        yield redis
    finally:
        redis.stop()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup):
    """The test database, and before it is dropped, this process's worker id lease
    let go: its connection would keep the database from being dropped."""
    yield
    forget_worker_lease()
