"""The key and its scope compared byte for byte on PostgreSQL (`OpaqueCharField`).

Both columns change in one `ALTER TABLE`, so the unique index on (scope, key) is
rebuilt once. The table is locked while it is: about a second per million records,
and the purge keeps the table to one time to live of traffic.
"""

from django.db import migrations

import idempotency.models

TABLE = "idempotency_idempotencyrecord"


def collate(collation: str):
    def alter(apps, schema_editor):
        if schema_editor.connection.vendor != "postgresql":
            return  # SQLite compares bytes already
        schema_editor.execute(
            f'ALTER TABLE "{TABLE}"'
            f' ALTER COLUMN "key" TYPE varchar(255) COLLATE "{collation}",'
            f' ALTER COLUMN "scope" TYPE varchar(64) COLLATE "{collation}"'
        )

    return alter


class Migration(migrations.Migration):
    dependencies = [
        ("idempotency", "0005_labels_2"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunPython(collate("C"), collate("default")),
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="idempotencyrecord",
                    name="key",
                    field=idempotency.models.OpaqueCharField(
                        max_length=255, verbose_name="key"
                    ),
                ),
                migrations.AlterField(
                    model_name="idempotencyrecord",
                    name="scope",
                    field=idempotency.models.OpaqueCharField(
                        max_length=64, verbose_name="scope"
                    ),
                ),
            ],
        ),
    ]
