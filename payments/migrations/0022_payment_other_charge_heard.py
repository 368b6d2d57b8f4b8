from django.db import migrations, models

from ledger.schema import AddIndexOnline


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY: payments go on while it builds

    dependencies = [
        ("payments", "0021_payment_other_charge"),
    ]

    operations = [
        AddIndexOnline(
            model_name="payment",
            index=models.Index(
                condition=~models.Q(("other_charge_txn_id", "")),
                fields=["other_charge_status"],
                name="payment_other_charge_heard",
            ),
        ),
    ]
