import json
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from ledger.services import customer_get_or_create, merchant_account, wallet_top_up

DEMO_CUSTOMER = "demo"
# A local demo shopper, printed on every `make run`; not a secret.
DEMO_PASSWORD = "demo-password"  # noqa: S105
DEMO_BALANCE = 100_000


class Command(BaseCommand):
    help = "Create the demo customer (funded wallet) and an admin; print how to log in."

    def handle(self, *args, **options) -> None:
        currency = settings.LEDGER_DEFAULT_CURRENCY
        merchant_account(currency=currency)
        _user, token, wallet = customer_get_or_create(
            username=DEMO_CUSTOMER, password=DEMO_PASSWORD, currency=currency
        )
        wallet_top_up(account_id=wallet.pk, at_least=DEMO_BALANCE)
        wallet.refresh_from_db()
        admin_password = self._admin_password()
        self.stdout.write(
            json.dumps(
                {
                    "customer": {
                        "username": DEMO_CUSTOMER,
                        "password": DEMO_PASSWORD,
                        "token": token,
                        "account": wallet.pk,
                        "balance": wallet.balance,
                    },
                    "admin": {"username": "admin", "password": admin_password},
                }
            )
        )

    def _admin_password(self) -> str:
        """Create the admin once with a random password, kept in the data folder so
        every later run can print it again."""
        stored = settings.DATA_DIR / "admin-password"
        User = get_user_model()
        if stored.exists() and User.objects.filter(username="admin").exists():
            return stored.read_text().strip()
        password = secrets.token_urlsafe(12)
        admin, _ = User.objects.get_or_create(
            username="admin", defaults={"is_staff": True, "is_superuser": True}
        )
        admin.is_staff = admin.is_superuser = True
        admin.set_password(password)
        admin.save()
        stored.write_text(password)
        stored.chmod(0o600)
        return password
