"""A Redis that outlives its database replays nothing of it.

The database is dropped and created again, under the same name, while Redis keeps
its cached responses: a customer of the new database with the same id and name,
sending the key the old one used, must have the write executed, not be answered
with the old database's response for an effect this one never had.
"""

import json
import os
import subprocess

import httpx
import psycopg
import pytest
from django.db import connection

from tests.helpers import new_key
from tests.servers import ROOT, gunicorn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BODY = {"to": "bob", "amount": 7, "currency": "CNY"}


def manage(url: str, *args: str) -> str:
    done = subprocess.run(
        [str(ROOT / ".venv/bin/python"), "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


# The commands an operator runs on a new database, in one process (each process
# of its own would set Django up again: seconds on a busy machine).
MAKE = """
import io
from django.core.management import call_command

call_command("migrate", interactive=False, verbosity=0)
alice = io.StringIO()
call_command("create_customer", "alice", "--balance", "1000", stdout=alice)
call_command("create_customer", "bob", stdout=io.StringIO())
print(alice.getvalue())
"""


def database(server: str, name: str) -> str:
    """A database `name` made afresh (dropped first) and migrated, with alice (1,000
    in her wallet, user id 1) and bob: alice's token."""
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}")
    made = json.loads(manage(f"{server}/{name}", "shell", "--no-imports", "-c", MAKE))
    return made["token"]


def test_a_database_made_again_behind_the_same_redis_executes_the_old_key(
    on_postgres, tmp_path
):
    """The same name, the same customer id, the same key: a database made again."""
    db = connection.settings_dict
    server = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}"
    name = f"{db['NAME']}_again"
    url = f"{server}/{name}"
    key = new_key()

    def transfer(web: str, token: str) -> httpx.Response:
        return httpx.post(
            f"{web}/api/v1/transfers",
            json=BODY,
            headers={"Idempotency-Key": key, "Authorization": f"Token {token}"},
        )

    def balance(web: str, token: str) -> int:
        mine = httpx.get(
            f"{web}/api/v1/accounts/me", headers={"Authorization": f"Token {token}"}
        )
        return mine.json()["balance"]

    try:
        token = database(server, name)
        with gunicorn(tmp_path, "ledger.settings.test", DATABASE_URL=url) as (web, _):
            assert transfer(web, token).status_code == 201
            again = transfer(web, token)
            assert again.headers["Idempotent-Replayed"] == "true"  # Redis has it
        token = database(server, name)  # dropped and made again
        with gunicorn(tmp_path, "ledger.settings.test", DATABASE_URL=url) as (web, _):
            answer = transfer(web, token)
            assert answer.status_code == 201, answer.text
            assert "Idempotent-Replayed" not in answer.headers
            assert balance(web, token) == 993  # executed, in this database
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
