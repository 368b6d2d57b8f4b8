from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("ledger", "0003_posting_balance_after")]

    operations = [
        migrations.AlterField(
            model_name="posting",
            name="balance_after",
            field=models.BigIntegerField(),
        ),
        migrations.AlterField(
            model_name="posting",
            name="version",
            field=models.BigIntegerField(),
        ),
    ]
