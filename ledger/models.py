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
from django.utils.translation import gettext, pgettext_lazy
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
    # The sum of the account's active holds; moved only by conditional UPDATEs
    # (`held = held + :amt WHERE balance - held >= :amt`).
    held = models.BigIntegerField(_("held"), default=0)
    version = models.BigIntegerField(_("version"), default=0)
    status = FSMField(
        _("status"), max_length=16, choices=Status.choices, default=Status.ACTIVE
    )
    # How many transitions the status took (`version` counts every posting too): the
    # admin's confirmation applies a transition only at the count it showed.
    status_version = models.PositiveIntegerField(_("status version"), default=0)
    # A merchant's sub-account (MERCHANT_SUB_ACCOUNTS): payments credit it instead
    # of the merchant's own row, and `merchant_sweep` moves its balance up here.
    # The outside world's sub-accounts take provider payments' other side alike.
    parent = models.ForeignKey(
        "self",
        verbose_name=_("sweeps into"),
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="sub_accounts",
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
            # 0 <= held <= balance: a hold never reserves money the account lacks
            # (only wallets hold; the outside world, below zero, never does).
            models.CheckConstraint(
                condition=Q(held__gte=0)
                & (Q(held__lte=models.F("balance")) | Q(kind="external")),
                name="account_held_within_balance",
            ),
            models.CheckConstraint(
                condition=Q(parent__isnull=True) | Q(kind__in=["merchant", "external"]),
                name="account_only_merchant_or_external_have_a_parent",
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
    # What `description` says, as a kind of text and its parameters, so that pages
    # show it in the reader's language (`ledger.texts`); empty for a free text.
    params = models.JSONField(_("text parameters"), default=dict, blank=True)
    created_at = models.DateTimeField(_("created"), auto_now_add=True, db_index=True)

    class Meta:
        verbose_name = _("journal entry")
        verbose_name_plural = _("journal entries")

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.reference}"


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
    # The account as this posting left it, taken from the balance update's RETURNING:
    # a statement reads them instead of summing history, and `check_ledger` proves
    # the latest posting's `balance_after` is the account's balance.
    balance_after = models.BigIntegerField(_("balance after"))
    version = models.BigIntegerField(_("version after"))

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
        return gettext("%(amount)s on account %(account)s") % {
            "amount": f"{self.amount:+d}",
            "account": self.account_id,
        }


class JournalSeal(models.Model):
    """An entry's place in the tamper-evident chain of the journal.

    `hash = SHA-256(prev_hash || canonical entry and its postings)`, `prev_hash` being
    the previous seal's hash. The sealer (`ledger.journal.journal_seal`, one at a time)
    seals committed entries in the order it finds them, so inserting an entry never
    waits for a global lock; `check_ledger` recomputes the chain and names any entry
    whose rows changed, or that vanished, after it was sealed. Append-only, like the
    entries. The reference to the entry has no database constraint on purpose: a
    seal must outlive an entry deleted behind the application's back, to name it.
    """

    entry = models.OneToOneField(
        JournalEntry,
        verbose_name=_("journal entry"),
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="seal",
    )
    seq = models.BigIntegerField(_("sequence number"), unique=True)
    prev_hash = models.CharField(_("previous hash"), max_length=64)
    hash = models.CharField(_("hash"), max_length=64)
    sealed_at = models.DateTimeField(_("sealed"), auto_now_add=True)

    class Meta:
        verbose_name = _("journal seal")
        verbose_name_plural = _("journal seals")

    def __str__(self) -> str:
        return gettext("seal #%(seq)s of entry %(entry)s") % {
            "seq": self.seq,
            "entry": self.entry_id,
        }


class TransferBatch(models.Model):
    """One transfer request: a single transfer or a batch of up to 100, all or
    nothing. Its id is the batch's id in the API."""

    sender = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("sender"),
        on_delete=models.PROTECT,
        related_name="+",
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)

    class Meta:
        verbose_name = _("transfer batch")
        verbose_name_plural = _("transfer batches")

    def __str__(self) -> str:
        return gettext("transfer batch %(id)s") % {"id": self.pk}


class Transfer(models.Model):
    """Money sent from one customer's wallet to another's: one journal entry, a
    debit of the sender and a credit of the recipient."""

    batch = models.ForeignKey(
        TransferBatch,
        verbose_name=_("transfer batch"),
        on_delete=models.PROTECT,
        related_name="transfers",
    )
    index = models.PositiveSmallIntegerField(_("position in batch"))
    entry = models.OneToOneField(
        JournalEntry,
        verbose_name=_("journal entry"),
        on_delete=models.PROTECT,
        related_name="transfer",
    )
    sender = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("sender"),
        on_delete=models.PROTECT,
        related_name="+",
    )
    recipient = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("recipient"),
        on_delete=models.PROTECT,
        related_name="+",
    )
    amount = models.BigIntegerField(_("amount"))
    currency = models.CharField(_("currency"), max_length=3)
    description = models.CharField(_("description"), max_length=255, blank=True)
    created_at = models.DateTimeField(_("created"), auto_now_add=True)

    # A transfer exists only once its money moved (it is written in the same
    # transaction), so it has one state.
    status = "succeeded"

    class Meta:
        verbose_name = _("transfer")
        verbose_name_plural = _("transfers")
        constraints = [
            models.UniqueConstraint(
                fields=["batch", "index"], name="transfer_batch_index_unique"
            ),
            models.CheckConstraint(
                condition=Q(amount__gt=0), name="transfer_amount_positive"
            ),
        ]
        indexes = [
            models.Index(fields=["sender", "-id"], name="transfer_sender_recent"),
            models.Index(fields=["recipient", "-id"], name="transfer_recipient_recent"),
        ]

    def __str__(self) -> str:
        return gettext("transfer %(id)s: %(amount)s %(currency)s") % {
            "id": self.pk,
            "amount": self.amount,
            "currency": self.currency,
        }


class Hold(models.Model):
    """Money reserved on an account until it is captured, voided or expires (as
    TigerBeetle's pending transfers, or a card authorization).

    While `active`, its amount counts in the account's `held`. Each change of status
    is a conditional `UPDATE ... WHERE status = 'active'`, so of a capture, a void
    and the expiry racing exactly one takes effect; its unique `reference` makes a
    replayed authorization find the hold instead of holding twice.
    """

    class Status(models.TextChoices):
        # "Active" is an account's status too (正常): a hold's reads differently.
        ACTIVE = "active", pgettext_lazy("hold status", "Active")
        CAPTURED = "captured", _("Captured")
        VOIDED = "voided", _("Voided")
        EXPIRED = "expired", _("Expired")

    account = models.ForeignKey(
        Account,
        verbose_name=_("account"),
        on_delete=models.PROTECT,
        related_name="holds",
    )
    amount = models.BigIntegerField(_("amount"))
    status = models.CharField(
        _("status"), max_length=16, choices=Status.choices, default=Status.ACTIVE
    )
    reference = models.CharField(_("reference"), max_length=300, unique=True)
    expires_at = models.DateTimeField(_("expires"))
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    released_at = models.DateTimeField(_("released"), null=True, blank=True)

    class Meta:
        verbose_name = _("hold")
        verbose_name_plural = _("holds")
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
        return gettext("hold %(reference)s (%(amount)s, %(status)s)") % {
            "reference": self.reference,
            "amount": self.amount,
            "status": self.get_status_display(),
        }
