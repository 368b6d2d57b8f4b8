from django.db import migrations, models

from ledger.schema import AddIndexOnline


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY: payments go on while it builds

    dependencies = [
        ("payments", "0016_payment_provider_settled"),
    ]

    operations = [
        AddIndexOnline(
            model_name="payment",
            index=models.Index(
                condition=models.Q(("redrive_parked_at__isnull", False)),
                fields=["redrive_parked_at"],
                name="payment_redrive_parked",
            ),
        ),
    ]
