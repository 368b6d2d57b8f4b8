"""The demo data of `make run`: a funded shopper, a friend to send money to and an
admin, plus whatever the apps above the ledger register (`demo_seeder`: the orders
app's products), so the ledger seeds them without importing those apps."""

import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction

from ledger.services import customer_get_or_create, merchant_account, wallet_top_up

DEMO_CUSTOMER = "demo"
# A local demo shopper, printed on every `make run`; not a secret.
DEMO_PASSWORD = "demo-password"  # noqa: S105
DEMO_BALANCE = 100_000
# A second customer, with an empty wallet, for the README's transfer examples: the
# banner shows its login and token too, to see a transfer arrive.
DEMO_FRIEND = "friend"
DEMO_FRIEND_PASSWORD = "friend-password"  # noqa: S105

# Two int4 keys, a lock space of its own (see `ledger.services._SEALER_LOCK`): one
# seeding at a time.
_SEED_LOCK = (0x1ED6E2, 2)

# name -> function seeding an app's demo data and returning what to show of it
_seeders: dict[str, Callable[[], Any]] = {}


def demo_seeder(name: str) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
    """Register `seed()` to run on every `demo_seed()`; its result is shown under
    `name`. It must be idempotent (it runs on every `make run`)."""

    def register(seed: Callable[[], Any]) -> Callable[[], Any]:
        _seeders[name] = seed
        return seed

    return register


def demo_seed() -> dict[str, Any]:
    """Create the demo customer (funded wallet), the friend (an empty wallet, to
    send to) and the admin, or find them again.

    Returns how to log in as each; the admin's password is random, made once and kept
    in the data folder (`password_file`) so every later run can show it again (None
    when the admin's password is no longer that one).

    One transaction, and one seeding at a time: two `make run`s started together
    on one database (and data folder) would otherwise both make an admin password,
    and the one kept in the folder need not be the one the admin has. The second
    waits for the first (PostgreSQL's advisory lock; SQLite's write lock, which a
    transaction takes as it begins), then finds everything made.
    """
    with transaction.atomic(durable=True):  # make run's and seed_demo's own
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", _SEED_LOCK)
        return _seed()


def _seed() -> dict[str, Any]:
    currency = settings.LEDGER_DEFAULT_CURRENCY
    merchant_account(currency=currency)
    _user, token, wallet = customer_get_or_create(
        username=DEMO_CUSTOMER, password=DEMO_PASSWORD, currency=currency
    )
    wallet_top_up(account_id=wallet.pk, at_least=DEMO_BALANCE)
    wallet.refresh_from_db()
    _friend, friend_token, friend_wallet = customer_get_or_create(
        username=DEMO_FRIEND, password=DEMO_FRIEND_PASSWORD, currency=currency
    )
    stored = settings.DATA_DIR / "admin-password"
    extras = {name: seed() for name, seed in _seeders.items()}
    return {
        **extras,
        "customer": {
            "username": DEMO_CUSTOMER,
            "password": DEMO_PASSWORD,
            "token": token,
            "account": wallet.pk,
            "balance": wallet.balance,
        },
        "friend": {
            "username": DEMO_FRIEND,
            "password": DEMO_FRIEND_PASSWORD,
            "token": friend_token,
            "account": friend_wallet.pk,
        },
        "admin": {
            "username": "admin",
            "password": _admin_password(stored),
            "password_file": str(stored),
        },
    }


def _admin_password(stored: Path) -> str | None:
    """The admin's password as kept in `stored`; None when this database's admin
    has another one (changed in the admin, or the data folder kept from a run on
    another database): shown, it would not let anybody in."""
    User = get_user_model()
    admin = User.objects.filter(username="admin").first()
    if stored.exists() and admin is not None:
        password = stored.read_text().strip()
        return password if admin.check_password(password) else None
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
