"""A Redis that outlives its database replays nothing of it.

The database is dropped and created again (or restored into a new one) while Redis
keeps its cached responses: a customer of the new database with the same id, sending
the key the old one used, must have the write executed, not be answered with the old
database's response for an effect this one never had.
"""

import json
import os
import subprocess

import httpx
import psycopg
import pytest
from django.db import connection

from tests.helpers import customer, new_key
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


def test_a_new_database_behind_the_same_redis_executes_the_old_key(
    on_postgres, tmp_path
):
    alice, api, _ = customer("alice", balance=1000)
    customer("bob")
    key = new_key()
    headers = {"Idempotency-Key": key}
    first = api.post("/api/v1/transfers", BODY, format="json", headers=headers)
    assert first.status_code == 201, first.content
    again = api.post("/api/v1/transfers", BODY, format="json", headers=headers)
    assert again["Idempotent-Replayed"] == "true"  # cached in Redis now

    db = connection.settings_dict
    server = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}"
    fresh = f"{db['NAME']}_again"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {fresh} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {fresh}")
    url = f"{server}/{fresh}"
    try:
        manage(url, "migrate", "--noinput", "-v0")
        with psycopg.connect(url, autocommit=True) as conn:  # alice's id again
            conn.execute(f"ALTER SEQUENCE auth_user_id_seq RESTART WITH {alice.pk}")
        made = json.loads(manage(url, "create_customer", "alice", "--balance", "1000"))
        manage(url, "create_customer", "bob")
        with psycopg.connect(url) as conn:
            assert conn.execute(
                "SELECT id FROM auth_user WHERE username = 'alice'"
            ).fetchone() == (alice.pk,)
        with gunicorn(tmp_path, "ledger.settings.test", DATABASE_URL=url) as (web, _):
            answer = httpx.post(
                f"{web}/api/v1/transfers",
                json=BODY,
                headers={**headers, "Authorization": f"Token {made['token']}"},
            )
            assert answer.status_code == 201, answer.text
            assert "Idempotent-Replayed" not in answer.headers
            mine = httpx.get(
                f"{web}/api/v1/accounts/me",
                headers={"Authorization": f"Token {made['token']}"},
            )
            assert mine.json()["balance"] == 993  # executed, in this database
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {fresh} WITH (FORCE)")
