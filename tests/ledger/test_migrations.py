"""Migrations that backfill what older rows lack: the ledger's 0003 the postings
written before `balance_after`, the provider simulator's 0007 the notifications
made before `outcome`."""

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


@pytest.mark.django_db(transaction=True)
def test_old_notifications_are_backfilled_with_the_outcome_they_reported(
    on_postgres,
):
    from payments.provider.models import Notification

    migrate([("provider_sim", "0006_notification_outcome")])
    try:
        with connection.cursor() as cursor:
            # Declined, then reopened and paid: the charge's status moved on.
            cursor.execute(
                "INSERT INTO provider_sim_charge (id, txn_id, merchant_order_no,"
                " amount, currency, description, return_url, status, created_at)"
                " VALUES (1, 'P1', '1001', 100, 'CNY', '', '', 'SUCCESS', now())"
            )
            cursor.execute(
                "INSERT INTO provider_sim_notification (id, charge_id, event_id,"
                " outcome, attempts, created_at) VALUES"
                " (1, 1, 'P1-1-FAILED', '', 1, now()),"
                " (2, 1, 'P1-2-SUCCESS', '', 1, now())"
            )
    finally:
        migrate()
    outcomes = Notification.objects.order_by("pk").values_list("outcome", flat=True)
    assert list(outcomes) == ["FAILED", "SUCCESS"]
