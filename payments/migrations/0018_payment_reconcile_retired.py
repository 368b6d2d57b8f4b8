from django.db import migrations, models


class Migration(migrations.Migration):
    # The column alone, in one transaction: the online steps that need it
    # (0019, not atomic) can then be run again after a failure.
    dependencies = [
        ("payments", "0017_payment_redrive_parked_index"),
    ]

    operations = [
        # Its database default: no rewrite of the table, and a process of the
        # release before (a rolling deploy) still inserts payments.
        migrations.AddField(
            model_name="payment",
            name="reconcile_retired",
            field=models.BooleanField(
                db_default=False,
                default=False,
                verbose_name="past the reconciliation window",
            ),
        ),
    ]
