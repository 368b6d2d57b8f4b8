from django.db import migrations, models

from ledger.schema import AddIndexOnline


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY: payments go on while it builds

    dependencies = [
        ("payments", "0015_payment_redrive_parking"),
    ]

    operations = [
        AddIndexOnline(
            model_name="payment",
            index=models.Index(
                condition=models.Q(("method", "provider"), ("status", "succeeded")),
                fields=["succeeded_at"],
                name="payment_provider_settled",
            ),
        ),
    ]
