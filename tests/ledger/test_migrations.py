"""Migration 0003 backfills the postings written before `balance_after`."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from ledger.invariants import ledger_report
from ledger.models import Posting


def migrate(target: list[tuple[str, str]] | None = None) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(target or executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_old_postings_are_backfilled_with_the_balance_after_them(on_postgres):
    migrate([("ledger", "0002_append_only")])
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO ledger_account (id, kind, currency, balance, version,"
                " status, created_at) VALUES (1, 'external', 'CNY', -150, 2, 'active',"
                " now()), (2, 'wallet', 'CNY', 120, 3, 'active', now()),"
                " (3, 'wallet', 'CNY', 30, 1, 'active', now())"
            )
            cursor.execute(
                "INSERT INTO ledger_journalentry (id, reference, kind, currency,"
                " description, created_at) VALUES"
                " (1, 'a', 'deposit', 'CNY', '', now()),"
                " (2, 'b', 'deposit', 'CNY', '', now()),"
                " (3, 'c', 'transfer', 'CNY', '', now())"
            )
            cursor.execute(
                "INSERT INTO ledger_posting (id, entry_id, account_id, amount) VALUES"
                " (1, 1, 1, -100), (2, 1, 2, 100), (3, 2, 1, -50), (4, 2, 2, 50),"
                " (5, 3, 2, -30), (6, 3, 3, 30)"
            )
    finally:
        migrate()
    rows = list(
        Posting.objects.order_by("pk").values_list(
            "account_id", "balance_after", "version"
        )
    )
    # the running sum per account; versions counted back from the account's
    assert rows == [(1, -100, 1), (2, 100, 1), (1, -150, 2), (2, 150, 2),
                    (2, 120, 3), (3, 30, 1)]  # fmt: skip
    report = ledger_report()
    assert report["ok"], report["violations"]
