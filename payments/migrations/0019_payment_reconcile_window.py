from datetime import timedelta

from django.conf import settings
from django.db import migrations, models
from django.db.models import Max

from idempotency.sql import DatabaseNow
from ledger.schema import AddIndexOnline, RemoveIndexOnline

BATCH = 20_000  # ids a statement: each commits on its own, its row locks briefly held


def retire_settled_before_the_window(apps, schema_editor):
    """Mark the provider payments settled before the reconciliation's window, a
    range of ids at a time (the column's default put every payment in it); a run of
    the reconciliation would otherwise mark them all in one statement. The window
    of the settings at hand: a run moves any payment that it leaves on the wrong
    side."""
    Payment = apps.get_model("payments", "Payment")
    since = DatabaseNow(
        plus=-timedelta(seconds=settings.PAYMENT_RECONCILE_WINDOW_SECONDS)
    )
    last = Payment.objects.aggregate(last=Max("pk"))["last"] or 0
    for start in range(0, last + 1, BATCH):
        Payment.objects.filter(
            pk__gte=start,
            pk__lt=start + BATCH,
            method="provider",
            status="succeeded",
            succeeded_at__lt=since,
        ).update(reconcile_retired=True)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY, and the marking in steps

    dependencies = [
        ("payments", "0018_payment_reconcile_retired"),
    ]

    operations = [
        migrations.RunPython(
            retire_settled_before_the_window, migrations.RunPython.noop, elidable=True
        ),
        AddIndexOnline(
            model_name="payment",
            index=models.Index(
                condition=models.Q(("method", "provider"), ("status", "succeeded")),
                fields=["reconcile_retired", "succeeded_at"],
                name="payment_reconcile_window",
            ),
        ),
        AddIndexOnline(
            model_name="payment",
            index=models.Index(
                condition=models.Q(
                    ("method", "provider"),
                    ("reconcile_retired", False),
                    ("redrive_parked_at__isnull", True),
                    ("status", "succeeded"),
                ),
                fields=["provider_asked_at", "id"],
                name="payment_reconcile_asked",
            ),
        ),
        AddIndexOnline(
            model_name="payment",
            index=models.Index(
                condition=models.Q(
                    ("method", "provider"),
                    ("redrive_parked_at__isnull", True),
                    ("status", "pending"),
                ),
                fields=["provider_asked_at", "id"],
                name="payment_pending_asked",
            ),
        ),
        RemoveIndexOnline(model_name="payment", name="payment_provider_settled"),
    ]
