"""Test settings: the real PostgreSQL and Redis on 127.0.0.1 unless told otherwise.

`LEDGER_TEST_DB=sqlite` runs the same tests on the embedded SQLite default instead.
"""

import os
import re
import tempfile

from .base import *  # noqa: F403
from .base import DATABASES, database_from_url, env

# A database number of a redis:// or rediss:// URL, before any query.
_NUMBERED = re.compile(r"(rediss?://[^/?#]*/)(\d+)(\?.*)?")


def per_worker(url: str, worker: int | None = None) -> str:
    """A Redis URL of this test process's own: `make test` runs the suite in two
    pytest-xdist workers at once, and worker N (`gwN`; `worker`, else this
    process's) takes the Redis database numbered N below the one named (gw0 and a
    plain run: the one named), so that one worker emptying its database never
    empties the other's. A URL naming no database number, or none N below, stops
    a worker but the first: taken as it is, two workers would share it. No URL (a
    run without Redis, `REDIS_URL=`) stays none. (The test database is per worker
    already: pytest-django names it `test_<name>_gwN`.)"""
    if worker is None:
        found = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
        worker = int(found[1]) if found else 0
    if worker == 0 or not url:
        return url
    numbered = _NUMBERED.fullmatch(url)
    if not numbered or int(numbered[2]) < worker:
        raise ValueError(
            f"{url}: no Redis database of its own for worker gw{worker}: name one "
            f"numbered {worker} or more (redis://host:port/N)"
        )
    return f"{numbered[1]}{int(numbered[2]) - worker}{numbered[3] or ''}"


def workers_apart(*urls: str) -> None:
    """Refuse Redis URLs (the cache's, the test broker's) of which two of the
    run's workers would take one database: `REDIS_URL=.../2` and
    `TEST_BROKER_URL=.../3` give the second worker's broker the first worker's
    cache, which its tests empty."""
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    taken: dict[str, int] = {}
    for index, url in enumerate(urls):
        if not url:
            continue
        for worker in range(count):
            mine = per_worker(url, worker)
            first = taken.setdefault(mine, index)
            if first != index:
                raise ValueError(
                    f"{urls[first]} and {url} share {mine} in a run of {count} "
                    "worker(s): name databases further apart"
                )


# The Redis database the tests are given (each worker takes its own: per_worker).
TEST_REDIS_URL = env("REDIS_URL", "redis://127.0.0.1:6379/15")

if env("LEDGER_TEST_DB") == "sqlite":
    _sqlite_dir = tempfile.mkdtemp(prefix="ledger-test-")
    DATABASES = {"default": database_from_url(f"sqlite:///{_sqlite_dir}/db.sqlite3")}
    # A file, not memory: threads in the concurrency tests need to share it.
    DATABASES["default"]["TEST"] = {"NAME": f"{_sqlite_dir}/test.sqlite3"}
    REDIS_URL = ""
else:
    DATABASES = {
        "default": database_from_url(
            env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/ledger")
        )
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    REDIS_URL = per_worker(TEST_REDIS_URL)

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_BROKER_URL = "memory://"
CELERY_BROKER_TRANSPORT_OPTIONS = {}
CELERY_TASK_ALWAYS_EAGER = False
# One merchant account, whatever the environment says: the tests that spread
# payments over sub-accounts set their own.
MERCHANT_SUB_ACCOUNTS = 0
