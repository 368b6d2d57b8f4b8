"""Migrations that backfill what older rows lack: the ledger's 0003 the postings
written before `balance_after`, the provider simulator's 0007 the notifications
made before `outcome`; and the idempotency's 0006, which changes the collation of
a table that already holds records."""

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.forms.models import model_to_dict

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


def _collations() -> dict[str, str | None]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name, collation_name FROM information_schema.columns"
            " WHERE table_name = 'idempotency_idempotencyrecord'"
            " AND column_name IN ('scope', 'key')"
        )
        return dict(cursor.fetchall())


@pytest.mark.django_db(transaction=True)
def test_stored_keys_are_compared_byte_for_byte_after_the_migration(on_postgres):
    from idempotency.models import IdempotencyRecord

    migrate([("idempotency", "0005_labels_2")])
    try:
        assert _collations() == {"scope": None, "key": None}
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO idempotency_idempotencyrecord (scope, key, endpoint,"
                " method, path, fingerprint, request_fields, status,"
                " response_headers, recovery_point, recovery_data, created_at,"
                " expires_at) VALUES ('user:1', 'K-1', 'e', 'POST', '/', 'f', '{}',"
                " 'succeeded', '{}', 'started', '{}', now(), now())"
            )
    finally:
        migrate()
    assert _collations() == {"scope": "C", "key": "C"}
    record = IdempotencyRecord.objects.get(scope="user:1", key="K-1")
    # The unique index was rebuilt, and still refuses a second record for the key.
    with pytest.raises(IntegrityError):
        IdempotencyRecord.objects.create(**{
            **model_to_dict(record, exclude=["id"]),
            "expires_at": record.expires_at,
        })  # fmt: skip
    # The index still serves the lookup, whose parameters are of the default collation.
    with transaction.atomic(), connection.cursor() as cursor:
        # (one row: the planner would rather scan it)
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(
            "EXPLAIN SELECT id FROM idempotency_idempotencyrecord"
            " WHERE scope = %s AND key = %s",
            ["user:1", "K-1"],
        )
        plan = " ".join(row[0] for row in cursor.fetchall())
    assert "idempotency_scope_key" in plan


@pytest.mark.django_db(transaction=True)
def test_payments_cancelled_before_the_charge_cancel_column_are_not_sent_again(
    on_postgres,
):
    """payments' 0012 adds `charge_cancel` with a database default: a payment
    cancelled before it, or inserted by a process of the release before it (a
    rolling deploy, which names none of the new columns), has it empty, so beat
    does not send its cancel again blindly."""
    from payments.models import Payment
    from payments.services import charges_to_cancel
    from tests.factories import OrderFactory

    order = OrderFactory(status=90)  # cancelled
    migrate([("payments", "0011_refund_at_provider")])
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO payments_payment (order_id, method, amount, currency,"
                " status, updated_at, provider_txn_id, pay_url)"
                " VALUES (%s, 'provider', 1000, 'CNY', 'cancelled',"
                " now() - interval '1 hour', 'Told', 'http://provider.invalid/pay/1')",
                [order.pk],
            )
    finally:
        migrate()
    with connection.cursor() as cursor:  # the previous release, after the migration
        cursor.execute(
            "INSERT INTO payments_payment (order_id, method, amount, currency,"
            " status, updated_at, provider_txn_id, pay_url)"
            " VALUES (%s, 'provider', 1000, 'CNY', 'cancelled',"
            " now() - interval '1 hour', 'Tnew', 'http://provider.invalid/pay/2')",
            [order.pk],
        )
    rows = Payment.objects.order_by("pk").values_list(
        "provider_txn_id", "charge_cancel", "charge_cancelled_at"
    )
    assert list(rows) == [("Told", "", None), ("Tnew", "", None)]
    assert charges_to_cancel(older_than_seconds=60) == []


@pytest.mark.django_db(transaction=True)
def test_payments_settled_before_the_reconciliation_window_are_left_out(on_postgres):
    """payments' 0019 marks the provider payments settled before the window
    `reconcile_retired`, so that the reconciliation's first run does not mark them
    all in one statement; the others, and a payment a process of the release before
    it inserts (a rolling deploy), have the column's database default."""
    from payments.models import Payment
    from payments.services import payments_to_reconcile
    from tests.factories import OrderFactory

    orders = [OrderFactory() for _ in range(4)]
    insert = (
        "INSERT INTO payments_payment (order_id, method, amount, currency, status,"
        " updated_at, succeeded_at, provider_txn_id, pay_url)"
        " VALUES (%s, %s, 1000, 'CNY', 'succeeded', now(), now() - %s::interval,"
        " '', '')"
    )
    migrate([("payments", "0017_payment_redrive_parked_index")])
    try:
        with connection.cursor() as cursor:
            for order, method, ago in zip(
                orders[:3],
                ["provider", "provider", "balance"],
                ["400 days", "1 day", "400 days"],
                strict=True,
            ):
                cursor.execute(insert, [order.pk, method, ago])
    finally:
        migrate()
    with connection.cursor() as cursor:  # the previous release, after the migration
        cursor.execute(insert, [orders[3].pk, "provider", "2 days"])
    rows = Payment.objects.order_by("pk").values_list("method", "reconcile_retired")
    assert list(rows) == [
        ("provider", True),
        ("provider", False),
        ("balance", False),
        ("provider", False),
    ]
    recent = Payment.objects.filter(reconcile_retired=False, method="provider")
    asked = payments_to_reconcile(
        settled_within_seconds=30 * 86400, asked_every_seconds=3600
    )
    assert asked == [p.pk for p in recent.order_by("pk")]


@pytest.mark.django_db(transaction=True)
def test_the_parent_rule_is_checked_online_and_holds(on_postgres):
    """ledger's 0014 adds its check NOT VALID and validates it after (no lock that
    holds writers off while the rows are read): the check ends up validated, and
    refuses a wallet with a parent."""
    printed = StringIO()
    call_command("sqlmigrate", "ledger", "0014", stdout=printed)
    statements = printed.getvalue()
    assert "NOT VALID" in statements and "VALIDATE CONSTRAINT" in statements
    migrate([("ledger", "0013_account_status_version")])
    migrate()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname, convalidated FROM pg_constraint"
            " WHERE conname LIKE 'account_only_%%have_a_parent'"
        )
        assert cursor.fetchall() == [
            ("account_only_merchant_or_external_have_a_parent", True)
        ]
        with pytest.raises(IntegrityError), transaction.atomic():
            cursor.execute(
                "INSERT INTO ledger_account (kind, currency, balance, held, version,"
                " status, status_version, created_at) VALUES"
                " ('external', 'CNY', 0, 0, 0, 'active', 0, now()),"
                " ('wallet', 'CNY', 0, 0, 0, 'active', 0, now())"
            )
            cursor.execute(
                "UPDATE ledger_account SET parent_id = (SELECT min(id) FROM"
                " ledger_account) WHERE kind = 'wallet'"
            )
