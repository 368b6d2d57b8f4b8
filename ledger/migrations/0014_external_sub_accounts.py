from django.db import migrations, models

from ledger.schema import AddCheckOnline


class Migration(migrations.Migration):
    atomic = False  # the new check validated without holding writers off

    dependencies = [
        ("ledger", "0013_account_status_version"),
    ]

    operations = [
        # The new rule first (external accounts may have a parent too), checked
        # online; then the old, stricter one goes (a moment's lock).
        AddCheckOnline(
            model_name="account",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("parent__isnull", True),
                    ("kind__in", ["merchant", "external"]),
                    _connector="OR",
                ),
                name="account_only_merchant_or_external_have_a_parent",
            ),
        ),
        migrations.RemoveConstraint(
            model_name="account",
            name="account_only_merchants_have_a_parent",
        ),
    ]
