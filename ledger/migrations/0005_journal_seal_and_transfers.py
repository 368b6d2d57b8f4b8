"""The journal's seals (a hash chain beside the entries) and transfers.

Seals are append-only like entries and postings: the same trigger function refuses
UPDATE and DELETE on them.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

FORBID = """
CREATE TRIGGER ledger_journalseal_append_only
    BEFORE UPDATE OR DELETE ON ledger_journalseal
    FOR EACH ROW EXECUTE FUNCTION ledger_forbid_change();
"""
ALLOW = "DROP TRIGGER IF EXISTS ledger_journalseal_append_only ON ledger_journalseal;"


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORBID, params=None)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ALLOW)


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0004_posting_balance_after_not_null"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="JournalSeal",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True,
                        primary_key=True,
                        serialize=False,
                        verbose_name="ID",
                    ),
                ),
                ("seq", models.BigIntegerField(unique=True)),
                ("prev_hash", models.CharField(max_length=64)),
                ("hash", models.CharField(max_length=64)),
                ("sealed_at", models.DateTimeField(auto_now_add=True)),
                (
                    "entry",
                    models.OneToOneField(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="seal",
                        to="ledger.journalentry",
                    ),
                ),
            ],
        ),
        migrations.CreateModel(
            name="TransferBatch",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True,
                        primary_key=True,
                        serialize=False,
                        verbose_name="ID",
                    ),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "sender",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={"verbose_name_plural": "transfer batches"},
        ),
        migrations.CreateModel(
            name="Transfer",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True,
                        primary_key=True,
                        serialize=False,
                        verbose_name="ID",
                    ),
                ),
                ("index", models.PositiveSmallIntegerField()),
                ("amount", models.BigIntegerField()),
                ("currency", models.CharField(max_length=3)),
                ("description", models.CharField(blank=True, max_length=255)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "entry",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="transfer",
                        to="ledger.journalentry",
                    ),
                ),
                (
                    "recipient",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "sender",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "batch",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="transfers",
                        to="ledger.transferbatch",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(
                        fields=["sender", "-id"], name="transfer_sender_recent"
                    ),
                    models.Index(
                        fields=["recipient", "-id"], name="transfer_recipient_recent"
                    ),
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("batch", "index"), name="transfer_batch_index_unique"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("amount__gt", 0)),
                        name="transfer_amount_positive",
                    ),
                ],
            },
        ),
        migrations.RunPython(forward, backward),
    ]
