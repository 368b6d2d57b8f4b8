from django.db import migrations, models


class Migration(migrations.Migration):
    # The columns alone, in one transaction: the index that needs them (0022, not
    # atomic) can then be built again after a failure.
    dependencies = [
        ("payments", "0020_provider_event_not_its_charge"),
    ]

    operations = [
        # Their database defaults: no rewrite of the table, and a process of the
        # release before (a rolling deploy) still inserts payments.
        migrations.AddField(
            model_name="payment",
            name="other_charge_txn_id",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                max_length=64,
                verbose_name="answer about another charge",
            ),
        ),
        migrations.AddField(
            model_name="payment",
            name="other_charge_status",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                max_length=16,
                verbose_name="status of the other charge",
            ),
        ),
    ]
