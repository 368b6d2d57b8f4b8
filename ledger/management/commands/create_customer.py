import json

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from ledger.fields import MAX_AMOUNT, storable
from ledger.services import customer_get_or_create, wallet_top_up


class Command(BaseCommand):
    help = (
        "Create (or find) a customer with an API token and a wallet; print one JSON "
        "line. --balance tops the wallet up to at least that many minor units through "
        "a ledger deposit."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("name")
        parser.add_argument("--balance", type=int, default=None)
        parser.add_argument("--password", default=None)

    def handle(self, *args, name: str, balance: int | None, password: str | None, **_):
        User = get_user_model()
        try:
            User._meta.get_field("username").clean(name, None)  # as a sign-up would
        except ValidationError as refused:
            # A customer made before the command checked names is found again all
            # the same, as the contract promises (a name the database cannot even
            # hold, with a NUL or a lone surrogate, is nobody's).
            if not (storable(name) and User.objects.filter(username=name).exists()):
                raise CommandError(
                    f"{name!r} is no username: {' '.join(refused.messages)}"
                ) from None
        if User.objects.filter(username=name, is_staff=True).exists():
            raise CommandError(f"{name!r} is a staff user, not a customer")
        if balance is not None and not 0 <= balance <= MAX_AMOUNT:
            raise CommandError(
                f"--balance is 0 to {MAX_AMOUNT} minor units, not {balance}"
            )
        # The command is the entry point: the customer and its top-up, or nothing.
        with transaction.atomic(durable=True):
            user, token, wallet = customer_get_or_create(
                username=name,
                password=password,
                currency=settings.LEDGER_DEFAULT_CURRENCY,
            )
            if balance:
                wallet_top_up(account_id=wallet.pk, at_least=balance)
        line = {"username": user.get_username(), "token": token, "account": wallet.pk}
        self.stdout.write(json.dumps(line))
