"""Give the notifications made before `outcome` was kept the outcome they reported.

Their event id ends in it (`<txn>-<attempt>-<SUCCESS|FAILED>`), while the charge's
status may have moved on since (declined, then reopened and paid): a redelivery must
say what the event said, or the merchant refuses it as an event id reused.
"""

from django.db import migrations

OUTCOMES = ("SUCCESS", "FAILED")


def backfill(apps, schema_editor):
    Notification = apps.get_model("provider_sim", "Notification")
    for outcome in OUTCOMES:
        Notification.objects.filter(
            outcome="", event_id__endswith=f"-{outcome}"
        ).update(outcome=outcome)


class Migration(migrations.Migration):
    dependencies = [("provider_sim", "0006_notification_outcome")]

    operations = [migrations.RunPython(backfill, migrations.RunPython.noop)]
