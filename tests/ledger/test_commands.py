import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection
from rest_framework.authtoken.models import Token

from ledger.models import Account, JournalEntry
from tests.conftest import run_in_threads

pytestmark = pytest.mark.django_db


def create_customer(*args: str) -> dict:
    out = StringIO()
    call_command("create_customer", *args, stdout=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def check_ledger() -> tuple[dict, str | None]:
    out = StringIO()
    try:
        call_command("check_ledger", stdout=out, stderr=StringIO())
        error = None
    except CommandError as exc:
        assert exc.returncode == 1
        error = str(exc)
    return json.loads(out.getvalue()), error


def test_create_customer_is_idempotent_and_tops_up_through_the_ledger():
    first = create_customer("alice", "--balance", "5000", "--password", "s3cret-pass")
    again = create_customer("alice", "--balance", "5000")
    assert first == again
    assert set(first) == {"username", "token", "account"}
    assert Token.objects.get(user__username="alice").key == first["token"]
    wallet = Account.objects.get(pk=first["account"])
    assert wallet.balance == 5000
    assert JournalEntry.objects.filter(kind="deposit").count() == 1
    create_customer("alice", "--balance", "7000")
    create_customer("alice", "--balance", "100")  # "at least": never takes money away
    wallet.refresh_from_db()
    assert wallet.balance == 7000
    assert wallet.owner.check_password("s3cret-pass")
    assert check_ledger()[0]["ok"]


@pytest.mark.parametrize("balance", ["-1", str(10**15 + 1), str(2**63 - 1)])
def test_create_customer_refuses_a_balance_out_of_range_and_creates_nothing(balance):
    with pytest.raises(CommandError, match="--balance is 0 to"):
        call_command("create_customer", "bob", "--balance", balance, stdout=StringIO())
    assert not Account.objects.filter(owner__username="bob").exists()
    assert not get_user_model().objects.filter(username="bob").exists()


@pytest.mark.parametrize(
    "name", ["", " ", "bad name!", "a/b", "x" * 151, "tab\tname", "a\x00b", "a\udcffb"]
)
def test_create_customer_refuses_a_name_no_client_could_use(name):
    """A transfer names its recipient by username: "" or "bad name!" would make a
    customer nobody can send to."""
    with pytest.raises(CommandError, match="is no username"):
        call_command("create_customer", name, stdout=StringIO())
    assert not get_user_model().objects.exists()


def test_create_customer_takes_any_name_a_sign_up_would():
    for name in ("李雷", "ann.lee+shop@example.com", "a-b_c"):
        assert create_customer(name)["username"] == name


def test_create_customer_finds_a_customer_made_before_names_were_checked():
    """Running it again returns the same customer, whatever name it has."""
    from ledger.services import customer_get_or_create

    _, token, wallet = customer_get_or_create(username="old name", currency="CNY")
    again = create_customer("old name")
    assert (again["token"], again["account"]) == (token, wallet.pk)


def test_create_customer_refuses_a_staff_user():
    get_user_model().objects.create_superuser("admin", password="x")
    with pytest.raises(CommandError, match="is a staff user"):
        call_command("create_customer", "admin", stdout=StringIO())
    assert not Account.objects.filter(owner__username="admin").exists()


def test_create_customer_whose_top_up_fails_creates_nothing(monkeypatch):
    def fails(**_):
        raise DatabaseError("the deposit could not be written")

    monkeypatch.setattr(
        "ledger.management.commands.create_customer.wallet_top_up", fails
    )
    with pytest.raises(DatabaseError):
        create_customer("erin", "--balance", "100")
    assert not get_user_model().objects.filter(username="erin").exists()


@pytest.mark.parametrize(
    ("edge", "funded", "asked"),
    [
        ("freeze", 100, "500"),
        ("close", 0, "500"),  # only an empty account can be closed
    ],
)
def test_create_customer_refuses_to_top_up_a_wallet_that_is_not_active(
    edge, funded, asked
):
    from ledger import services

    wallet_id = create_customer("frank", "--balance", str(funded))["account"]
    getattr(services, f"account_{edge}")(account_id=wallet_id)
    hashed = get_user_model().objects.get(username="frank").password
    deposits = JournalEntry.objects.filter(kind="deposit").count()
    with pytest.raises(CommandError) as refused:
        call_command(
            "create_customer",
            "frank",
            "--balance",
            asked,
            "--password",
            "n3w-s3cret-pass",
            stdout=StringIO(),
        )
    message = str(refused.value)
    status = Account.objects.get(pk=wallet_id).status
    assert refused.value.returncode == 1
    assert message == (
        f"the wallet of 'frank' (account {wallet_id}) is {status}: --balance tops "
        "up only an active wallet; nothing changed"
    )
    assert Account.objects.get(pk=wallet_id).balance == funded
    assert JournalEntry.objects.filter(kind="deposit").count() == deposits
    assert get_user_model().objects.get(username="frank").password == hashed
    # Without --balance the customer is still found, as before.
    assert create_customer("frank")["account"] == wallet_id


def test_create_customer_run_again_on_a_frozen_wallet_holding_the_balance():
    """Safe to run again: a frozen wallet that holds the balance asked for needs
    no deposit, so the run answers the same user and token, changing nothing."""
    from ledger import services

    first = create_customer("gina", "--balance", "100")
    services.account_freeze(account_id=first["account"])
    deposits = JournalEntry.objects.filter(kind="deposit").count()
    assert create_customer("gina", "--balance", "100") == first
    assert JournalEntry.objects.filter(kind="deposit").count() == deposits
    assert Account.objects.get(pk=first["account"]).balance == 100


def test_create_customer_tops_up_an_unfrozen_wallet_again():
    from ledger import services

    wallet_id = create_customer("gina", "--balance", "100")["account"]
    services.account_freeze(account_id=wallet_id)
    services.account_unfreeze(account_id=wallet_id)
    assert create_customer("gina", "--balance", "300")["account"] == wallet_id
    assert Account.objects.get(pk=wallet_id).balance == 300


@pytest.mark.django_db(transaction=True)
def test_concurrent_top_ups_deposit_once():
    create_customer("carol")
    results = run_in_threads(6, lambda _: create_customer("carol", "--balance", "900"))
    assert all(isinstance(r, dict) for r in results), results
    assert len({r["token"] for r in results}) == 1
    assert Account.objects.get(pk=results[0]["account"]).balance == 900
    assert JournalEntry.objects.filter(kind="deposit").count() == 1


def test_check_ledger_names_each_violation():
    wallet = Account.objects.get(
        pk=create_customer("dave", "--balance", "100")["account"]
    )
    report, error = check_ledger()
    assert report["ok"] and error is None
    assert report["money_inside"] == {"CNY": 100}
    # Corrupt a balance behind the ledger's back.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE ledger_account SET balance = balance + 5 WHERE id = %s", [wallet.pk]
        )
    report, error = check_ledger()
    assert not report["ok"] and error
    assert any(f"account {wallet.pk} balance 105" in v for v in report["violations"])
    assert any("sum to 5, not 0" in v for v in report["violations"])


def test_the_admin_password_shown_is_one_that_lets_the_admin_in(settings, tmp_path):
    from ledger.demo import demo_seed
    from ledger.management.commands.serve import banner

    settings.DATA_DIR = tmp_path / "first"
    settings.DATA_DIR.mkdir()
    first = demo_seed()["admin"]
    assert (
        get_user_model().objects.get(username="admin").check_password(first["password"])
    )
    assert demo_seed()["admin"]["password"] == first["password"]  # every run alike

    # A data folder kept from a run on another database, or a password changed in
    # the admin: the password kept is not this admin's, and is not shown.
    other = tmp_path / "other"
    other.mkdir()
    (other / "admin-password").write_text("from-another-database")
    settings.DATA_DIR = other
    demo = demo_seed()
    assert demo["admin"]["password"] is None
    shown = banner(8000, demo)
    assert "from-another-database" not in shown
    assert "delete that file and start again" in shown
    admin = get_user_model().objects.get(username="admin")
    assert admin.check_password(first["password"])  # untouched
    # Which the next run then does: a new password, set and shown.
    (other / "admin-password").unlink()
    fresh = demo_seed()["admin"]["password"]
    admin.refresh_from_db()
    assert fresh and admin.check_password(fresh)


def test_check_ledger_on_a_database_never_migrated_says_so(tmp_path):
    """As an operator runs it against an empty data folder: one line that says
    what to do, not a traceback about a missing table."""
    import os
    import subprocess
    import sys

    from tests.servers import ROOT

    env = {"PATH": os.environ["PATH"], "LEDGER_DATA_DIR": str(tmp_path)}
    ran = subprocess.run(
        [sys.executable, "manage.py", "check_ledger"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 3, ran.stderr
    assert "migrations not applied: run `manage.py migrate` first" in ran.stderr
    assert "Traceback" not in ran.stderr


@pytest.mark.parametrize(
    "password", ["", " ", " " * 12, "\t \n", "short", "pass\x00word!"]
)
def test_create_customer_refuses_a_password_nobody_could_log_in_with(password):
    with pytest.raises(CommandError, match="--password"):
        call_command(
            "create_customer", "bob", "--password", password, stdout=StringIO()
        )
    assert not get_user_model().objects.filter(username="bob").exists()
    assert not Account.objects.exists()


def test_create_customer_keeps_the_password_an_empty_one_would_replace():
    create_customer("alice", "--password", "s3cret-pass")
    with pytest.raises(CommandError, match="--password is empty"):
        call_command("create_customer", "alice", "--password", "", stdout=StringIO())
    assert get_user_model().objects.get(username="alice").check_password("s3cret-pass")
