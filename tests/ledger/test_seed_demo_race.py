"""`manage.py seed_demo` (what `make run` seeds) run twice at once, as two
terminals' `make run` on one database do: two real processes on PostgreSQL,
released together. One set of demo data, and the admin password both print is the
one kept in the data folder and the one that lets the admin in."""

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.conf import global_settings
from django.contrib.auth import get_user_model
from django.db import connection
from rest_framework.authtoken.models import Token

from ledger.demo import DEMO_BALANCE
from ledger.models import Account
from orders.demo import DEMO_PRODUCTS
from orders.models import Product
from tests.helpers import assert_ledger_ok, wait_for
from tests.servers import ROOT
from tests.workers import process_env

pytestmark = [pytest.mark.django_db(transaction=True)]


def seed_demo(data_dir: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "manage.py", "seed_demo", *args],
        cwd=ROOT,
        env=process_env(
            # As `make run` has it: the real password hasher, whose slowness
            # (a fraction of a second a password) is part of the race.
            DJANGO_SETTINGS_MODULE="ledger.settings",
            LEDGER_DATA_DIR=str(data_dir),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def released_together(count: int, start) -> list[subprocess.CompletedProcess]:
    """Start `count` processes with `start()` while the accounts table is locked,
    and let them go at once when all of them wait for it (their start-up, seconds
    long, would otherwise decide who runs first)."""
    db = connection.settings_dict
    with psycopg.connect(
        dbname=db["NAME"], user=db["USER"], host=db["HOST"], port=db["PORT"]
    ) as gate:
        gate.execute("LOCK TABLE ledger_account IN ACCESS EXCLUSIVE MODE")
        processes = [start() for _ in range(count)]
        try:
            wait_for(lambda: waiting() >= count, 30, "both seeds at the gate")
        finally:
            gate.rollback()
    results = []
    for process in processes:
        out, err = process.communicate(timeout=60)
        results.append(
            subprocess.CompletedProcess(process.args, process.returncode, out, err)
        )
    return results


def waiting() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


def test_seed_demo_twice_at_once_seeds_once(on_postgres, tmp_path, settings):
    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS  # the seeds' own
    runs = released_together(2, lambda: seed_demo(tmp_path))

    assert [run.returncode for run in runs] == [0, 0], [run.stderr for run in runs]
    shown = [json.loads(run.stdout) for run in runs]
    User = get_user_model()
    assert sorted(User.objects.values_list("username", flat=True)) == [
        "admin",
        "demo",
        "friend",
    ]
    assert Token.objects.count() == 2
    wallets = Account.objects.filter(kind=Account.Kind.WALLET)
    assert wallets.count() == 2
    assert Account.objects.filter(kind=Account.Kind.MERCHANT).count() == 1
    demo = wallets.get(owner__username="demo")
    assert demo.balance == DEMO_BALANCE
    assert {p.sku: p.stock for p in Product.objects.all()} == {
        sku: stock for sku, _, _, stock in DEMO_PRODUCTS
    }
    # Both print the same logins, and the admin's password is the one kept and
    # the one that works.
    assert shown[0]["customer"] == shown[1]["customer"]
    assert shown[0]["friend"] == shown[1]["friend"]
    kept = (tmp_path / "admin-password").read_text().strip()
    admin = User.objects.get(username="admin")
    assert admin.check_password(kept)
    assert [s["admin"]["password"] for s in shown] == [kept, kept]
    assert_ledger_ok()


def test_seed_demo_with_an_unknown_option_says_so_and_seeds_nothing(
    on_postgres, tmp_path
):
    run = seed_demo(tmp_path, "--users=5")
    out, err = run.communicate(timeout=60)
    assert run.returncode == 2, (out, err)
    assert "unrecognized arguments: --users=5" in err
    assert "Traceback" not in err
    assert not get_user_model().objects.exists()
    assert not Account.objects.exists()
    assert not (tmp_path / "admin-password").exists()
