"""Test settings: the real PostgreSQL and Redis on 127.0.0.1 unless told otherwise.

`LEDGER_TEST_DB=sqlite` runs the same tests on the embedded SQLite default instead.
"""

import os
import re
import tempfile

from .base import *  # noqa: F403
from .base import DATABASES, database_from_url, env


def per_worker(url: str) -> str:
    """A Redis URL of this test process's own: `make test` runs the suite in two
    pytest-xdist workers at once, and worker N (`gwN`) takes the Redis database
    numbered N below the one named (gw0 and a plain run: the one named), so that one
    worker emptying its database never empties the other's. (The test database is
    per worker already: pytest-django names it `test_<name>_gwN`.)"""
    worker = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    found = re.fullmatch(r"(redis://[^/]*/)(\d+)", url)
    if not worker or not found or int(worker[1]) == 0:
        return url
    database = int(found[2]) - int(worker[1])
    if database < 0:
        raise ValueError(f"{url}: no Redis database below it for worker {worker[0]}")
    return f"{found[1]}{database}"


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
    REDIS_URL = per_worker(env("REDIS_URL", "redis://127.0.0.1:6379/15"))

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_BROKER_URL = "memory://"
CELERY_BROKER_TRANSPORT_OPTIONS = {}
CELERY_TASK_ALWAYS_EAGER = False
# One merchant account, whatever the environment says: the tests that spread
# payments over sub-accounts set their own.
MERCHANT_SUB_ACCOUNTS = 0
