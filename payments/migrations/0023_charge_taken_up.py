import django.db.models.deletion
import django.db.models.functions.datetime
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    # A new table that only this release reads and writes: a process of the release
    # before (a rolling deploy) never touches it, and creating it (with its unique
    # and foreign-key indexes, on no rows) locks no table that payments write.
    dependencies = [
        ("payments", "0022_payment_other_charge_heard"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ChargeTakenUp",
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
                (
                    "provider_txn_id",
                    models.CharField(
                        max_length=64,
                        unique=True,
                        verbose_name="provider transaction id",
                    ),
                ),
                (
                    "taken_up_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        verbose_name="taken up",
                    ),
                ),
                (
                    "taken_up_by",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                        verbose_name="taken up by",
                    ),
                ),
            ],
            options={
                "verbose_name": "charge taken up with the provider",
                "verbose_name_plural": "charges taken up with the provider",
            },
        ),
    ]
