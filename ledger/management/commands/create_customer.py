import json

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from ledger.exceptions import AccountNotActive
from ledger.fields import MAX_AMOUNT, storable
from ledger.models import Account
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
        parser.add_argument(
            "--password",
            default=None,
            help="the web UI password: not blank, and as AUTH_PASSWORD_VALIDATORS ask",
        )

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
        if password is not None:
            self.check_password(password, User.objects.filter(username=name).first())
        if balance is not None and not 0 <= balance <= MAX_AMOUNT:
            raise CommandError(
                f"--balance is 0 to {MAX_AMOUNT} minor units, not {balance}"
            )
        # The command is the entry point: the customer and its top-up, or nothing.
        try:
            with transaction.atomic(durable=True):
                user, token, wallet = customer_get_or_create(
                    username=name,
                    password=password,
                    currency=settings.LEDGER_DEFAULT_CURRENCY,
                )
                if balance:
                    wallet_top_up(
                        account_id=wallet.pk, at_least=balance, active_only=True
                    )
        except AccountNotActive:
            # Rolled back: a password given along is not set either.
            status = Account.objects.values_list("status", flat=True).get(pk=wallet.pk)
            raise CommandError(
                f"the wallet of {name!r} (account {wallet.pk}) is {status}: "
                "--balance tops up only an active wallet; nothing changed"
            ) from None
        line = {"username": user.get_username(), "token": token, "account": wallet.pk}
        self.stdout.write(json.dumps(line))

    @staticmethod
    def check_password(password: str, user: User | None) -> None:
        """Refuse a password nobody could log in with, or that the settings'
        validators refuse (as Django's own createsuperuser and changepassword do):
        the command's refusal, before anything is created."""
        if not password.strip():
            raise CommandError(
                "--password is empty: give one, or leave --password out (a new "
                "customer then has no web UI password, an existing one keeps theirs)"
            )
        if not storable(
            password
        ):  # the log-in form refuses a NUL; the hash, a surrogate
            raise CommandError("--password holds a NUL or a lone surrogate")
        try:
            validate_password(password, user)
        except ValidationError as refused:
            raise CommandError(
                f"--password refused: {' '.join(refused.messages)}"
            ) from None
