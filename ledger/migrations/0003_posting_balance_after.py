"""Each posting records the account's balance and version after it.

Existing postings are backfilled rather than left NULL, so every row explains itself
and the column can be NOT NULL (0004): `balance_after` is the running sum of the
account's postings in id order (the order the balance moved in: a posting's id is
drawn while its account's row is locked), and `version` counts back from the
account's current version, so the latest posting carries it. The append-only trigger
is set aside for this one UPDATE, in the migration's own transaction.
"""

from django.db import migrations, models

BACKFILL = """
UPDATE ledger_posting
SET balance_after = r.running, version = r.version
FROM (
    SELECT p.id,
           SUM(p.amount) OVER (PARTITION BY p.account_id ORDER BY p.id) AS running,
           a.version - COUNT(*) OVER (PARTITION BY p.account_id)
               + ROW_NUMBER() OVER (PARTITION BY p.account_id ORDER BY p.id)
               AS version
    FROM ledger_posting p JOIN ledger_account a ON a.id = p.account_id
) AS r
WHERE ledger_posting.id = r.id
"""


def backfill(apps, schema_editor):
    postgres = schema_editor.connection.vendor == "postgresql"
    if postgres:
        schema_editor.execute(
            "ALTER TABLE ledger_posting DISABLE TRIGGER ledger_posting_append_only"
        )
    schema_editor.execute(BACKFILL)
    if postgres:
        schema_editor.execute(
            "ALTER TABLE ledger_posting ENABLE TRIGGER ledger_posting_append_only"
        )


class Migration(migrations.Migration):
    dependencies = [("ledger", "0002_append_only")]

    operations = [
        migrations.AddField(
            model_name="posting",
            name="balance_after",
            field=models.BigIntegerField(null=True),
        ),
        migrations.AddField(
            model_name="posting",
            name="version",
            field=models.BigIntegerField(null=True),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
