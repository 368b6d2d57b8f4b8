import factory
from django.conf import settings
from django.contrib.auth import get_user_model

from ledger.models import Account


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.PostGenerationMethodCall("set_password", "correct-horse-9")


class WalletFactory(factory.django.DjangoModelFactory):
    """A wallet with no money; fund it through `ledger_deposit`, never by setting
    `balance`, or the ledger's invariants would (rightly) fail."""

    class Meta:
        model = Account

    owner = factory.SubFactory(UserFactory)
    kind = Account.Kind.WALLET
    currency = settings.LEDGER_DEFAULT_CURRENCY
