"""Payments of orders.

A payment is `pending` until the money has moved, then `succeeded` (or `failed`);
a refund moves a succeeded payment to `refunded`. A pending provider payment whose
order was paid another way is `cancelled` once its charge is cancelled at the
provider. A partial unique index allows at most one succeeded payment per order:
whatever path tries to settle an order a second time stops at the database.

With manual capture a wallet payment is first `authorized`: a hold reserves its
money on the wallet, and it then ends `succeeded` (captured), `voided` or `expired`,
always together with its hold (one transaction, the hold's status guarded).
"""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from ledger.fsm import ProtectedStateMixin
from ledger.models import Hold, JournalEntry
from orders.models import Order


class Payment(ProtectedStateMixin, ConcurrentTransitionMixin, models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", _("Pending")
        SUCCEEDED = "succeeded", _("Succeeded")
        FAILED = "failed", _("Failed")
        REFUNDED = "refunded", _("Refunded")
        CANCELLED = "cancelled", _("Cancelled")
        AUTHORIZED = "authorized", _("Authorized")
        VOIDED = "voided", _("Voided")
        EXPIRED = "expired", _("Expired")

    class Capture(models.TextChoices):
        AUTOMATIC = "automatic", _("Automatic")
        MANUAL = "manual", _("Manual")

    class Method(models.TextChoices):
        BALANCE = "balance", _("Wallet balance")
        PROVIDER = "provider", _("Payment provider")

    order = models.ForeignKey(
        Order,
        verbose_name=_("order"),
        on_delete=models.PROTECT,
        related_name="payments",
    )
    method = models.CharField(_("method"), max_length=16, choices=Method.choices)
    amount = models.BigIntegerField(_("amount"))  # minor units
    currency = models.CharField(_("currency"), max_length=3)
    status = FSMField(
        _("status"),
        max_length=16,
        choices=Status.choices,
        default=Status.PENDING,
        protected=True,
    )
    # The ledger entry that moved the money, once it moved.
    journal_entry = models.OneToOneField(
        JournalEntry,
        verbose_name=_("journal entry"),
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="payment",
    )
    # Manual capture: the hold that reserves the money, and how much it reserved
    # (`amount` becomes what was captured).
    hold = models.OneToOneField(
        Hold,
        verbose_name=_("hold"),
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="payment",
    )
    authorized_amount = models.BigIntegerField(
        _("authorized amount"), null=True, blank=True
    )
    # By the database's clock, not this host's: the re-drive of payments stuck
    # pending compares it with the database's clock (a host whose clock runs fast
    # would otherwise hide its payments from the re-drive for as long).
    created_at = models.DateTimeField(_("created"), db_default=Now())
    updated_at = models.DateTimeField(_("updated"), auto_now=True)
    succeeded_at = models.DateTimeField(_("succeeded"), null=True, blank=True)
    # A provider payment: the provider's transaction id and the page the payer
    # confirms on, recorded once the provider answered our charge request.
    provider_txn_id = models.CharField(
        _("provider transaction"), max_length=64, blank=True, db_index=True
    )
    pay_url = models.URLField(_("pay URL"), max_length=500, blank=True)
    # When beat last asked the provider how a provider payment stands, long pending
    # (`payments_stuck`) or settled lately (`payments_to_reconcile`, which finds a
    # charge refunded at the provider); each asks the least recently asked first.
    provider_asked_at = models.DateTimeField(
        _("provider last asked"), null=True, blank=True
    )
    # Beat's re-drive refused for a business reason (money cannot leave a frozen
    # merchant account): each refusal is counted, with its error, and after
    # PAYMENT_REDRIVE_MAX_ATTEMPTS of them the payment is parked (`redrive_parked_at`)
    # for staff, who re-drive it from the admin once its cause is fixed, instead of
    # being asked about again every rotation (`payment_redrive`).
    redrive_attempts = models.PositiveSmallIntegerField(
        _("re-drive failed attempts"), default=0, db_default=0
    )
    redrive_error = models.TextField(
        _("re-drive last error"), blank=True, default="", db_default=""
    )
    redrive_parked_at = models.DateTimeField(
        _("re-drive parked"), null=True, blank=True
    )
    # A provider payment settled before the reconciliation's window (as of its last
    # run, which sets it and clears it: `payments_to_reconcile`): left out of the
    # index of payments it asks about, so that a run reads the payments it asks
    # about, not every success ever made nor every one asked lately.
    reconcile_retired = models.BooleanField(
        _("past the reconciliation window"), default=False, db_default=False
    )
    # The provider's answer, to beat's re-drive or reconciliation or to the
    # cancel of an open charge, about a charge that is not this payment's
    # (`_not_its_charge`): it changed nothing, and is kept here for staff, as a
    # callback's is on its event. The last one; a collected charge stays over a
    # later answer that one was not collected. `/metrics` counts these payments;
    # `check_ledger` names a collected charge that no payment booked.
    other_charge_txn_id = models.CharField(
        _("answer about another charge"),
        max_length=64,
        blank=True,
        default="",
        db_default="",
    )
    other_charge_status = models.CharField(
        _("status of the other charge"),
        max_length=16,
        blank=True,
        default="",
        db_default="",
    )

    class ChargeCancel(models.TextChoices):
        NONE = "", _("No cancel to follow up")
        PENDING = "pending", _("To be cancelled by the provider")
        CONFIRMED = "confirmed", _("Cancelled by the provider")

    # A charge opened for a payment already closed (its pay request recorded it
    # after the cancel found no charge, or after beat's re-drive failed it and the
    # order stopped taking money) is cancelled by a task the record sends:
    # `pending` until the provider confirms the cancel (`confirmed`, with when).
    # Beat sends the task again for one still pending, as it does for a refund to
    # return. Payments cancelled before this column have it empty, as have those
    # a process of the release before it cancels (a rolling deploy): its database
    # default.
    charge_cancel = models.CharField(
        _("charge cancel at the provider"),
        max_length=16,
        choices=ChargeCancel.choices,
        default=ChargeCancel.NONE,
        db_default=ChargeCancel.NONE,
        blank=True,
    )
    charge_cancelled_at = models.DateTimeField(
        _("charge cancelled"), null=True, blank=True
    )

    class Meta:
        verbose_name = _("payment")
        verbose_name_plural = _("payments")
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["order"],
                condition=Q(status="succeeded"),
                name="payment_one_success_per_order",
            ),
            models.CheckConstraint(
                condition=Q(amount__gt=0), name="payment_amount_positive"
            ),
        ]
        indexes = [
            # Beat's re-drives look for these few rows among every payment ever
            # made, every minute (tests/ops/test_periodic_queries.py).
            models.Index(
                fields=["created_at"],
                condition=Q(method="provider", status="pending"),
                name="payment_provider_pending",
            ),
            models.Index(
                fields=["updated_at"],
                condition=Q(charge_cancel="pending"),
                name="payment_charge_cancel_pending",
            ),
            # Beat's reconciliation: the settled provider payments entering and
            # leaving its window, by settlement time ...
            models.Index(
                fields=["reconcile_retired", "succeeded_at"],
                condition=Q(method="provider", status="succeeded"),
                name="payment_reconcile_window",
            ),
            # ... and those within it, by when the provider was last asked: a run
            # walks the never asked, then the least recently asked, and stops at
            # its batch (tests/payments/test_sweep_plans.py).
            models.Index(
                fields=["provider_asked_at", "id"],
                condition=Q(
                    method="provider",
                    status="succeeded",
                    reconcile_retired=False,
                    redrive_parked_at__isnull=True,
                ),
                name="payment_reconcile_asked",
            ),
            # Beat's re-drive of stuck payments, in the same order.
            models.Index(
                fields=["provider_asked_at", "id"],
                condition=Q(
                    method="provider", status="pending", redrive_parked_at__isnull=True
                ),
                name="payment_pending_asked",
            ),
            # `/metrics` counts the parked ones on every scrape; the admin's
            # filter lists them.
            models.Index(
                fields=["redrive_parked_at"],
                condition=Q(redrive_parked_at__isnull=False),
                name="payment_redrive_parked",
            ),
            # The few that heard of another charge: `/metrics` counts them,
            # `check_ledger` reads the collected ones.
            models.Index(
                fields=["other_charge_status"],
                condition=~Q(other_charge_txn_id=""),
                name="payment_other_charge_heard",
            ),
        ]

    def __str__(self) -> str:
        return gettext("payment %(id)s (%(method)s, %(status)s)") % {
            "id": self.pk,
            "method": self.get_method_display(),
            "status": self.get_status_display(),
        }

    @property
    def used_provider_charge(self) -> bool:
        """Whether this is a provider payment that booked money: the provider keys
        its one charge by merchant order number, and this one collected it (kept,
        or given back), so the order has no provider charge left to open. Read from
        the row alone, so a page that has the order's payments asks nothing more
        (`payments.services.provider_charge_used`, the order page)."""
        return self.method == self.Method.PROVIDER and self.journal_entry_id is not None

    # Transitions only declare the legal edges; services save them.
    # A provider may report success after reporting failure (the payer retried on
    # the pay page), or after we cancelled (the payer confirmed before the cancel
    # reached the provider); the money arrived, so the payment succeeds (and is
    # refunded at once if the order no longer takes it).
    @transition(
        field=status,
        source=[Status.PENDING, Status.FAILED, Status.CANCELLED],
        target=Status.SUCCEEDED,
    )
    def succeed(self) -> None:
        pass

    @transition(field=status, source=Status.PENDING, target=Status.FAILED)
    def fail(self) -> None:
        pass

    @transition(field=status, source=Status.PENDING, target=Status.CANCELLED)
    def cancel(self) -> None:
        pass

    @transition(field=status, source=Status.SUCCEEDED, target=Status.REFUNDED)
    def refund(self) -> None:
        pass

    # Manual capture: an authorized payment ends exactly one way, as its hold does.
    @transition(field=status, source=Status.AUTHORIZED, target=Status.SUCCEEDED)
    def capture(self) -> None:
        pass

    @transition(field=status, source=Status.AUTHORIZED, target=Status.VOIDED)
    def void(self) -> None:
        pass

    @transition(field=status, source=Status.AUTHORIZED, target=Status.EXPIRED)
    def expire(self) -> None:
        pass


class Refund(models.Model):
    """Money given back for a payment: at most one per payment (the unique
    one-to-one is the last guard), moved by a reversing ledger entry."""

    payment = models.OneToOneField(
        Payment,
        verbose_name=_("payment"),
        on_delete=models.PROTECT,
        related_name="refund_record",
    )
    amount = models.BigIntegerField(_("amount"))  # minor units
    currency = models.CharField(_("currency"), max_length=3)
    reason = models.CharField(_("reason"), max_length=64, default="requested")
    journal_entry = models.OneToOneField(
        JournalEntry,
        verbose_name=_("journal entry"),
        on_delete=models.PROTECT,
        related_name="refund",
    )
    created_at = models.DateTimeField(_("created"), db_default=Now())

    class AtProvider(models.TextChoices):
        NONE = "", _("Not a provider payment")
        PENDING = "pending", _("To be returned by the provider")
        RETURNED = "returned", _("Returned by the provider")
        REFUSED = "refused", _("Refused by the provider")

    # A provider payment's money goes back to the payer through the provider: the
    # refund commits `pending` and a task asks the provider (outside any
    # transaction; the provider refunds a charge once however often it is asked),
    # then marks it `returned`, or `refused` if the provider says it cannot (an
    # operator's case, named by `check_ledger`). Beat sends the task again for one
    # still pending. The column's default is the database's too, so a process of the
    # release before it (a rolling deploy) can still insert refunds.
    at_provider = models.CharField(
        _("at the provider"),
        max_length=16,
        choices=AtProvider.choices,
        default=AtProvider.NONE,
        db_default=AtProvider.NONE,
        blank=True,
    )
    returned_at = models.DateTimeField(_("returned"), null=True, blank=True)

    class Meta:
        verbose_name = _("refund")
        verbose_name_plural = _("refunds")
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(amount__gt=0), name="refund_amount_positive"
            ),
        ]
        indexes = [
            models.Index(  # beat's re-drive of refunds the provider did not confirm
                fields=["created_at"],
                condition=Q(at_provider="pending"),
                name="refund_at_provider_pending",
            ),
        ]

    def __str__(self) -> str:
        return gettext("refund %(id)s of payment %(payment)s") % {
            "id": self.pk,
            "payment": self.payment_id,
        }


# What a provider callback can report (`ProviderEvent.kind`).
CALLBACK_STATUSES = ("SUCCESS", "FAILED")

# The outcome of a provider event about a charge that is not its payment's.
_NOT_ITS_CHARGE = "not the payment's charge"


class ProviderEvent(models.Model):
    """The inbox: every valid provider callback, stored before we answer 200.

    The unique `event_id` turns a redelivery into a no-op; a Celery task processes
    each row once (`received` -> `processed`) and may be retried safely. An event
    whose processing keeps failing (a business refusal, not a lost connection) is
    `parked` after PROVIDER_EVENT_MAX_ATTEMPTS failed attempts: kept, no longer
    re-driven by beat, until an operator re-drives it (`received` again). An event
    about a charge that is not its payment's is processed changing nothing, with
    the outcome NOT_ITS_CHARGE (the others read `payment <status>`).
    """

    class Status(models.TextChoices):
        RECEIVED = "received", _("Received")
        PROCESSED = "processed", _("Processed")
        PARKED = "parked", _("Parked")

    NOT_ITS_CHARGE = _NOT_ITS_CHARGE

    event_id = models.CharField(_("event id"), max_length=128, unique=True)
    payment = models.ForeignKey(
        Payment,
        verbose_name=_("payment"),
        on_delete=models.PROTECT,
        related_name="provider_events",
    )
    kind = models.CharField(_("reported status"), max_length=16)
    payload = models.JSONField(_("payload"))
    raw_body = models.TextField(_("raw body"))
    status = models.CharField(
        _("status"), max_length=16, choices=Status.choices, default=Status.RECEIVED
    )
    outcome = models.CharField(_("outcome"), max_length=64, blank=True)
    # Failed attempts since it was received or last re-driven by an operator, and
    # why the last one failed.
    attempts = models.PositiveIntegerField(_("failed attempts"), default=0)
    last_error = models.TextField(_("last error"), blank=True)
    # By the database's clock, as `Payment.created_at` (the inbox re-drive).
    received_at = models.DateTimeField(_("received"), db_default=Now())
    processed_at = models.DateTimeField(_("processed"), null=True, blank=True)
    parked_at = models.DateTimeField(_("parked"), null=True, blank=True)

    class Meta:
        verbose_name = _("provider event")
        verbose_name_plural = _("provider events")
        ordering = ["-id"]
        indexes = [
            # The few open events among the many processed ones: beat's re-drive,
            # `/metrics` and `check_ledger` read only these.
            models.Index(
                fields=["status", "received_at"],
                condition=Q(status__in=["received", "parked"]),
                name="provider_event_open",
            ),
            # The few about another charge than their payment's: `/metrics` counts them.
            models.Index(
                fields=["received_at"],
                condition=Q(outcome=_NOT_ITS_CHARGE),
                name="provider_event_not_its_charge",
            ),
        ]

    def __str__(self) -> str:
        return gettext("event %(id)s (%(kind)s, %(status)s)") % {
            "id": self.event_id,
            "kind": self.kind,
            "status": self.get_status_display(),
        }


class ChargeTakenUp(models.Model):
    """A provider charge reported collected in an answer about another charge than
    its payment's, that staff have taken up with the provider (refunded it there,
    settled it by hand): `check_ledger` no longer names it. Once per charge (the
    unique transaction id); who and when, for the record."""

    provider_txn_id = models.CharField(
        _("provider transaction id"), max_length=64, unique=True
    )
    taken_up_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("taken up by"),
        on_delete=models.PROTECT,
        related_name="+",
    )
    # By the database's clock, as `Payment.created_at`.
    taken_up_at = models.DateTimeField(_("taken up"), db_default=Now())

    class Meta:
        verbose_name = _("charge taken up with the provider")
        verbose_name_plural = _("charges taken up with the provider")

    def __str__(self) -> str:
        return self.provider_txn_id


class CallbackNonce(models.Model):
    """A callback nonce seen: the unique index makes each single-use; beat purges
    them after they expire."""

    nonce = models.CharField(_("nonce"), max_length=128, unique=True)
    expires_at = models.DateTimeField(_("expires"), db_index=True)

    class Meta:
        verbose_name = _("callback nonce")
        verbose_name_plural = _("callback nonces")

    def __str__(self) -> str:
        return self.nonce


class Shipment(models.Model):
    """The one shipment task of a paid order (the unique order is the guard).
    Cancelled when the order is refunded before it was dispatched."""

    class Status(models.TextChoices):
        PENDING = "pending", _("Pending")
        DISPATCHED = "dispatched", _("Dispatched")
        CANCELLED = "cancelled", _("Cancelled")

    order = models.OneToOneField(
        Order,
        verbose_name=_("order"),
        on_delete=models.PROTECT,
        related_name="shipment",
    )
    status = models.CharField(
        _("status"), max_length=16, choices=Status.choices, default=Status.PENDING
    )
    created_at = models.DateTimeField(_("created"), db_default=Now())
    dispatched_at = models.DateTimeField(_("dispatched"), null=True, blank=True)

    class Meta:
        verbose_name = _("shipment")
        verbose_name_plural = _("shipments")
        indexes = [
            models.Index(  # beat's re-drive of shipments whose task was lost
                fields=["created_at"],
                condition=Q(status="pending"),
                name="shipment_pending",
            ),
        ]

    def __str__(self) -> str:
        return gettext("shipment of order %(order)s (%(status)s)") % {
            "order": self.order_id,
            "status": self.get_status_display(),
        }
