"""Test settings: the real PostgreSQL and Redis on 127.0.0.1 unless told otherwise.

`LEDGER_TEST_DB=sqlite` runs the same tests on the embedded SQLite default instead.
"""

import tempfile

from .base import *  # noqa: F403
from .base import DATABASES, database_from_url, env

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
    REDIS_URL = env("REDIS_URL", "redis://127.0.0.1:6379/15")

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_BROKER_URL = "memory://"
CELERY_BROKER_TRANSPORT_OPTIONS = {}
CELERY_TASK_ALWAYS_EAGER = False
# One merchant account, whatever the environment says: the tests that spread
# payments over sub-accounts set their own.
MERCHANT_SUB_ACCOUNTS = 0
