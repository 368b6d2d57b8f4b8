from django.db import migrations, models

from ledger.schema import AddIndexOnline


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY: callbacks go on while it builds

    dependencies = [
        ("payments", "0019_payment_reconcile_window"),
    ]

    operations = [
        AddIndexOnline(
            model_name="providerevent",
            index=models.Index(
                condition=models.Q(("outcome", "not the payment's charge")),
                fields=["received_at"],
                name="provider_event_not_its_charge",
            ),
        ),
    ]
