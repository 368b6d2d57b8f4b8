"""The double-entry ledger: accounts, journal entries and their postings.

Money is an integer number of minor units. A balance changes only together with a
posting of the same amount, inside one journal entry whose postings sum to zero, so
the sum of all balances is always zero and every balance can be rebuilt from its
postings. Entries are append-only: a correction is a reversing entry.

A wallet's `held` is money reserved by active holds (authorize now, capture later):
it always equals the sum of the wallet's active holds, and only `available` =
`balance - held` may be debited or held again.
"""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django_fsm import FSMField, transition


class Account(models.Model):
    class Kind(models.TextChoices):
        WALLET = "wallet", "Customer wallet"
        MERCHANT = "merchant", "Merchant account"
        # The outside world: where deposits come from and withdrawals go. Its balance
        # is the negative of all the money inside the system, so it may go below zero.
        EXTERNAL = "external", "External (outside world)"

    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        FROZEN = "frozen", "Frozen"
        CLOSED = "closed", "Closed"

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="accounts",
    )
    # System accounts (the merchant, the outside world) are found by code.
    code = models.SlugField(max_length=64, null=True, blank=True, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.WALLET)
    currency = models.CharField(max_length=3, default="CNY")
    balance = models.BigIntegerField(default=0)
    # The sum of the account's active holds; moved only by conditional UPDATEs
    # (`held = held + :amt WHERE balance - held >= :amt`).
    held = models.BigIntegerField(default=0)
    version = models.BigIntegerField(default=0)
    status = FSMField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(balance__gte=0) | Q(kind="external"),
                name="account_balance_not_negative",
            ),
            # 0 <= held <= balance: a hold never reserves money the account lacks
            # (only wallets hold; the outside world, below zero, never does).
            models.CheckConstraint(
                condition=Q(held__gte=0)
                & (Q(held__lte=models.F("balance")) | Q(kind="external")),
                name="account_held_within_balance",
            ),
            models.UniqueConstraint(
                fields=["owner", "currency"],
                condition=Q(kind="wallet"),
                name="account_one_wallet_per_currency",
            ),
        ]

    def __str__(self) -> str:
        who = self.code or (self.owner.get_username() if self.owner else "?")
        return f"{self.kind}:{who} ({self.currency})"

    @property
    def available(self) -> int:
        """What may be debited or held: the balance less the active holds."""
        return self.balance - self.held

    # Transitions only declare the legal edges; services save and log.
    @transition(field=status, source=Status.ACTIVE, target=Status.FROZEN)
    def freeze(self) -> None:
        pass

    @transition(field=status, source=Status.FROZEN, target=Status.ACTIVE)
    def unfreeze(self) -> None:
        pass

    @transition(
        field=status, source=[Status.ACTIVE, Status.FROZEN], target=Status.CLOSED
    )
    def close(self) -> None:
        pass


class JournalEntry(models.Model):
    """One movement of money. Its unique `reference` makes a replayed movement fail on
    the constraint instead of moving money twice."""

    class Kind(models.TextChoices):
        DEPOSIT = "deposit", "Deposit"
        WITHDRAWAL = "withdrawal", "Withdrawal"
        TRANSFER = "transfer", "Transfer"
        PAYMENT = "payment", "Payment"
        REFUND = "refund", "Refund"
        ADJUSTMENT = "adjustment", "Adjustment"

    reference = models.CharField(max_length=300, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    currency = models.CharField(max_length=3)
    description = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        verbose_name_plural = "journal entries"

    def __str__(self) -> str:
        return f"{self.kind} {self.reference}"


class Posting(models.Model):
    """One leg of an entry: a signed amount on one account (negative leaves it)."""

    entry = models.ForeignKey(
        JournalEntry, on_delete=models.PROTECT, related_name="postings"
    )
    account = models.ForeignKey(
        Account, on_delete=models.PROTECT, related_name="postings"
    )
    amount = models.BigIntegerField()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=~Q(amount=0), name="posting_amount_nonzero"
            )
        ]
        indexes = [
            models.Index(fields=["account", "-id"], name="posting_account_recent")
        ]

    def __str__(self) -> str:
        return f"{self.amount:+d} on account {self.account_id}"


class Hold(models.Model):
    """Money reserved on an account until it is captured, voided or expires (as
    TigerBeetle's pending transfers, or a card authorization).

    While `active`, its amount counts in the account's `held`. Each change of status
    is a conditional `UPDATE ... WHERE status = 'active'`, so of a capture, a void
    and the expiry racing exactly one takes effect; its unique `reference` makes a
    replayed authorization find the hold instead of holding twice.
    """

    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        CAPTURED = "captured", "Captured"
        VOIDED = "voided", "Voided"
        EXPIRED = "expired", "Expired"

    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="holds")
    amount = models.BigIntegerField()
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.ACTIVE
    )
    reference = models.CharField(max_length=300, unique=True)
    expires_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(amount__gt=0), name="hold_amount_positive"
            ),
        ]
        indexes = [
            # The few active holds among many released ones: the expiry task and
            # `check_ledger` read only these.
            models.Index(
                fields=["expires_at"],
                condition=Q(status="active"),
                name="hold_active_expiry",
            ),
            models.Index(
                fields=["account"],
                condition=Q(status="active"),
                name="hold_active_account",
            ),
        ]

    def __str__(self) -> str:
        return f"hold {self.reference} ({self.amount}, {self.status})"
