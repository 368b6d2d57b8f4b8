"""The double-entry ledger: accounts, journal entries and their postings.

Money is an integer number of minor units. A balance changes only together with a
posting of the same amount, inside one journal entry whose postings sum to zero, so
the sum of all balances is always zero and every balance can be rebuilt from its
postings. Entries are append-only: a correction is a reversing entry.
"""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _
from django_fsm import FSMField, transition


class Account(models.Model):
    class Kind(models.TextChoices):
        WALLET = "wallet", _("Customer wallet")
        MERCHANT = "merchant", _("Merchant account")
        # The outside world: where deposits come from and withdrawals go. Its balance
        # is the negative of all the money inside the system, so it may go below zero.
        EXTERNAL = "external", _("External (outside world)")

    class Status(models.TextChoices):
        ACTIVE = "active", _("Active")
        FROZEN = "frozen", _("Frozen")
        CLOSED = "closed", _("Closed")

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("owner"),
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="accounts",
    )
    # System accounts (the merchant, the outside world) are found by code.
    code = models.SlugField(
        _("code"), max_length=64, null=True, blank=True, unique=True
    )
    kind = models.CharField(
        _("kind"), max_length=16, choices=Kind.choices, default=Kind.WALLET
    )
    currency = models.CharField(_("currency"), max_length=3, default="CNY")
    balance = models.BigIntegerField(_("balance"), default=0)
    version = models.BigIntegerField(_("version"), default=0)
    status = FSMField(
        _("status"), max_length=16, choices=Status.choices, default=Status.ACTIVE
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)

    class Meta:
        verbose_name = _("account")
        verbose_name_plural = _("accounts")
        constraints = [
            models.CheckConstraint(
                condition=Q(balance__gte=0) | Q(kind="external"),
                name="account_balance_not_negative",
            ),
            models.UniqueConstraint(
                fields=["owner", "currency"],
                condition=Q(kind="wallet"),
                name="account_one_wallet_per_currency",
            ),
        ]

    def __str__(self) -> str:
        who = self.code or (self.owner.get_username() if self.owner else "?")
        return f"{self.get_kind_display()} {who} ({self.currency})"

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
        DEPOSIT = "deposit", _("Deposit")
        WITHDRAWAL = "withdrawal", _("Withdrawal")
        TRANSFER = "transfer", _("Transfer")
        PAYMENT = "payment", _("Payment")
        REFUND = "refund", _("Refund")
        ADJUSTMENT = "adjustment", _("Adjustment")

    reference = models.CharField(_("reference"), max_length=300, unique=True)
    kind = models.CharField(_("kind"), max_length=16, choices=Kind.choices)
    currency = models.CharField(_("currency"), max_length=3)
    description = models.CharField(_("description"), max_length=255, blank=True)
    created_at = models.DateTimeField(_("created"), auto_now_add=True, db_index=True)

    class Meta:
        verbose_name = _("journal entry")
        verbose_name_plural = _("journal entries")

    def __str__(self) -> str:
        return f"{self.kind} {self.reference}"


class Posting(models.Model):
    """One leg of an entry: a signed amount on one account (negative leaves it)."""

    entry = models.ForeignKey(
        JournalEntry,
        verbose_name=_("journal entry"),
        on_delete=models.PROTECT,
        related_name="postings",
    )
    account = models.ForeignKey(
        Account,
        verbose_name=_("account"),
        on_delete=models.PROTECT,
        related_name="postings",
    )
    amount = models.BigIntegerField(_("amount"))

    class Meta:
        verbose_name = _("posting")
        verbose_name_plural = _("postings")
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
