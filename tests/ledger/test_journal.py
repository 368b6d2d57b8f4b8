"""The tamper-evident journal: seals chain every entry; check_ledger names a row
changed or removed behind the application's back."""

import hashlib
import json
from io import StringIO
from itertools import pairwise

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from ledger.journal import GENESIS, canonical
from ledger.models import JournalEntry, JournalSeal
from ledger.services import journal_seal, ledger_deposit, ledger_transfer
from tests.conftest import run_in_threads
from tests.helpers import customer

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("on_postgres")]


def check_ledger() -> tuple[dict, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("check_ledger", stdout=out, stderr=err)
    except CommandError as exc:
        assert exc.returncode == 1
    return json.loads(out.getvalue()), err.getvalue()


@pytest.fixture
def movements():
    """Three entries: two deposits and a transfer."""
    _, _, alice = customer("alice", balance=1000)
    _, _, bob = customer("bob", balance=500)
    ledger_transfer(
        source_id=alice.pk,
        destination_id=bob.pk,
        amount=300,
        currency="CNY",
        reference="t1",
    )
    return list(JournalEntry.objects.order_by("pk"))


def behind_the_back(sql: str, params: list | None = None) -> None:
    """Run SQL as an intruder would: with every trigger (the append-only guard and
    the foreign keys) set aside, in the test's transaction."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(sql, params)
        cursor.execute("SET LOCAL session_replication_role = origin")


def test_check_ledger_seals_the_entries_and_prints_the_head(movements):
    report, _ = check_ledger()
    assert report["ok"], report["violations"]
    seals = list(JournalSeal.objects.order_by("seq"))
    assert [s.entry_id for s in seals] == [e.pk for e in movements]
    assert [s.seq for s in seals] == [1, 2, 3]
    assert seals[0].prev_hash == GENESIS
    for before, seal in pairwise(seals):
        assert seal.prev_hash == before.hash
    # The hash is SHA-256(prev_hash || canonical entry and postings).
    last = movements[-1]
    expected = hashlib.sha256(
        seals[-1].prev_hash.encode() + canonical(last, last.postings.all())
    ).hexdigest()
    assert seals[-1].hash == expected
    assert report["journal"] == {
        "seq": 3,
        "hash": expected,
        "entry": last.pk,
        "sealed_now": 3,
    }
    again, _ = check_ledger()
    assert again["journal"]["sealed_now"] == 0
    assert "journal_chain_intact" in again["checks"]
    assert "postings_explain_balances" in again["checks"]


def test_new_entries_extend_the_chain(movements):
    assert journal_seal() == 3
    _, _, carol = customer("carol", balance=7)
    assert journal_seal() == 1
    seal = JournalSeal.objects.get(seq=4)
    assert seal.entry.postings.filter(account=carol).exists()
    assert seal.prev_hash == JournalSeal.objects.get(seq=3).hash
    assert journal_seal() == 0


def test_an_entry_edited_in_sql_is_named(movements):
    check_ledger()
    target = movements[1]
    behind_the_back(
        "UPDATE ledger_journalentry SET description = 'nothing to see' WHERE id = %s",
        [target.pk],
    )
    report, err = check_ledger()
    assert not report["ok"]
    assert any(
        f"journal entry {target.pk} (seal #2)" in v and "changed" in v
        for v in report["violations"]
    ), report["violations"]
    assert f"journal entry {target.pk}" in err
    # The entries after it still verify: only the edited one is named.
    assert len([v for v in report["violations"] if "journal entry" in v]) == 1


def test_a_posting_edited_in_sql_names_its_entry(movements):
    check_ledger()
    transfer = movements[2]
    posting = transfer.postings.order_by("pk").first()
    # Even with the balances kept consistent, the seal remembers.
    behind_the_back(
        "UPDATE ledger_posting SET balance_after = balance_after + 1 WHERE id = %s",
        [posting.pk],
    )
    report, _ = check_ledger()
    assert not report["ok"]
    assert any(f"journal entry {transfer.pk} (seal #3)" in v
               for v in report["violations"]), report["violations"]  # fmt: skip


def test_an_entry_deleted_in_sql_is_named(movements):
    check_ledger()
    gone = movements[0]
    behind_the_back("DELETE FROM ledger_posting WHERE entry_id = %s", [gone.pk])
    behind_the_back("DELETE FROM ledger_journalentry WHERE id = %s", [gone.pk])
    report, err = check_ledger()
    assert not report["ok"]
    assert any(f"journal entry {gone.pk} (seal #1) is missing" in v
               for v in report["violations"]), report["violations"]  # fmt: skip
    assert "violation: journal entry" in err


def test_a_seal_deleted_in_sql_breaks_the_chain(movements):
    check_ledger()
    behind_the_back("DELETE FROM ledger_journalseal WHERE seq = 2")
    report, _ = check_ledger()
    assert not report["ok"]
    assert any("#2..#2 are missing" in v for v in report["violations"]), report


def test_entries_stay_append_only(movements):
    from django.db import DatabaseError, transaction

    check_ledger()
    for sql in (
        "UPDATE ledger_journalentry SET description = 'x'",
        "DELETE FROM ledger_journalseal",
        "UPDATE ledger_journalseal SET hash = 'x'",
    ):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            connection.cursor().execute(sql)


@pytest.mark.django_db(transaction=True)
def test_sealers_and_writers_at_once_make_one_unbroken_chain():
    _, _, wallet = customer("alice", balance=1)

    def work(i: int) -> int:
        if i % 2:
            ledger_deposit(account_id=wallet.pk, amount=1, reference=f"dep-{i}")
            return 0
        from django.db import transaction

        with transaction.atomic(durable=True):
            return journal_seal()

    run_in_threads(12, work)
    journal_seal()
    seqs = list(JournalSeal.objects.order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, JournalEntry.objects.count() + 1))
    report, _ = check_ledger()
    assert report["ok"], report["violations"]


@pytest.mark.django_db(transaction=True)
def test_beat_seals_the_journal_every_minute(settings):
    from ledger.tasks import seal_journal

    schedule = settings.CELERY_BEAT_SCHEDULE["ledger-seal-journal"]
    assert schedule == {"task": "ledger.tasks.seal_journal", "schedule": 60.0}
    customer("alice", balance=5)
    assert seal_journal() == 1
    assert seal_journal() == 0
