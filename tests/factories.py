"""factory_boy factories for every model, for tests that need rows, not a story.

Money never moves through a factory: a wallet is created empty and funded through
`ledger_deposit`, an order's payment is made by the services (`tests.helpers`), or
the ledger's invariants would (rightly) fail. These build the rows around them:
users, wallets, pre-orders, orders, payments as a provider leaves them, inbox events,
key records, the simulator's charges.
"""

from datetime import timedelta

import factory
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from idempotency.models import IdempotencyRecord
from idempotency.snowflake import next_snowflake
from ledger.models import Account, JournalEntry
from orders.models import Order, PreOrder
from payments.models import CallbackNonce, Payment, ProviderEvent, Shipment
from payments.provider.models import Charge, Notification


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


class JournalEntryFactory(factory.django.DjangoModelFactory):
    """An entry with no postings (they sum to zero); for read-side tests only."""

    class Meta:
        model = JournalEntry

    reference = factory.Sequence(lambda n: f"test-entry:{n}")
    kind = JournalEntry.Kind.DEPOSIT
    currency = settings.LEDGER_DEFAULT_CURRENCY


class PreOrderFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = PreOrder

    owner = factory.SubFactory(UserFactory)
    merchant_order_no = factory.LazyFunction(lambda: str(next_snowflake()))
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(hours=1))


class OrderFactory(factory.django.DjangoModelFactory):
    """An order pending payment, for its own pre-order's number."""

    class Meta:
        model = Order

    owner = factory.SubFactory(UserFactory)
    merchant_order_no = factory.LazyAttribute(
        lambda o: PreOrderFactory(owner=o.owner).merchant_order_no
    )
    amount = 1000
    currency = settings.LEDGER_DEFAULT_CURRENCY
    description = "Tea"


class PaymentFactory(factory.django.DjangoModelFactory):
    """A provider payment as the pay request's last phase leaves it: pending, with
    the provider's transaction and pay page."""

    class Meta:
        model = Payment

    order = factory.SubFactory(OrderFactory)
    method = Payment.Method.PROVIDER
    amount = factory.SelfAttribute("order.amount")
    currency = factory.SelfAttribute("order.currency")
    provider_txn_id = factory.LazyAttribute(lambda p: f"T{p.order.merchant_order_no}")
    pay_url = "http://provider.invalid/pay/x"


class ProviderEventFactory(factory.django.DjangoModelFactory):
    """A provider callback stored in the inbox, not yet processed."""

    class Meta:
        model = ProviderEvent

    event_id = factory.Sequence(lambda n: f"evt-test-{n}")
    payment = factory.SubFactory(PaymentFactory)
    kind = "SUCCESS"
    payload = factory.LazyAttribute(
        lambda e: {
            "event_id": e.event_id,
            "merchant_order_no": e.payment.order.merchant_order_no,
            "provider_txn_id": e.payment.provider_txn_id,
            "status": e.kind,
            "amount": e.payment.amount,
        }
    )
    raw_body = factory.LazyAttribute(lambda e: str(e.payload))


class CallbackNonceFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = CallbackNonce

    nonce = factory.Sequence(lambda n: f"nonce-{n}")
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(minutes=10))


class ShipmentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Shipment

    order = factory.SubFactory(OrderFactory)


class IdempotencyRecordFactory(factory.django.DjangoModelFactory):
    """A finished key record of a 201."""

    class Meta:
        model = IdempotencyRecord

    scope = factory.Sequence(lambda n: f"user:{n}")
    key = factory.Sequence(lambda n: f"key-{n}")
    endpoint = "orders.create"
    method = "POST"
    path = "/api/v1/orders"
    fingerprint = factory.Sequence(lambda n: f"{n:064x}")
    status = IdempotencyRecord.Status.SUCCEEDED
    response_status = 201
    response_headers = factory.LazyFunction(
        lambda: {"Content-Type": "application/json"}
    )
    response_body = b"{}"
    recovery_point = "finished"
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(days=1))


class ChargeFactory(factory.django.DjangoModelFactory):
    """The provider simulator's open charge for an order."""

    class Meta:
        model = Charge

    txn_id = factory.Sequence(lambda n: f"Ptest{n:08d}")
    merchant_order_no = factory.LazyFunction(lambda: str(next_snowflake()))
    amount = 1000
    currency = settings.LEDGER_DEFAULT_CURRENCY


class NotificationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Notification

    charge = factory.SubFactory(ChargeFactory)
    event_id = factory.Sequence(lambda n: f"evt-sim-{n}")
    # What the event reports: the charge's outcome when it was made.
    outcome = factory.LazyAttribute(lambda note: note.charge.status)
