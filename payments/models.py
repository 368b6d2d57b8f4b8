"""Payments of orders.

A payment is `pending` until the money has moved, then `succeeded` (or `failed`);
a refund moves a succeeded payment to `refunded`. A partial unique index allows at most
one succeeded payment per order: whatever path tries to settle an order a second time
stops at the database.
"""

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from ledger.models import JournalEntry
from orders.models import Order


class Payment(ConcurrentTransitionMixin, models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", _("Pending")
        SUCCEEDED = "succeeded", _("Succeeded")
        FAILED = "failed", _("Failed")
        REFUNDED = "refunded", _("Refunded")

    class Method(models.TextChoices):
        BALANCE = "balance", _("Wallet balance")
        PROVIDER = "provider", _("Payment provider")

    order = models.ForeignKey(Order, on_delete=models.PROTECT, related_name="payments")
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
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="payment",
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)
    succeeded_at = models.DateTimeField(_("succeeded"), null=True, blank=True)

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

    def __str__(self) -> str:
        return f"payment {self.pk} ({self.method}, {self.status})"

    # Transitions only declare the legal edges; services save them.
    @transition(field=status, source=Status.PENDING, target=Status.SUCCEEDED)
    def succeed(self) -> None:
        pass

    @transition(field=status, source=Status.PENDING, target=Status.FAILED)
    def fail(self) -> None:
        pass

    @transition(field=status, source=Status.SUCCEEDED, target=Status.REFUNDED)
    def refund(self) -> None:
        pass


class Refund(models.Model):
    """Money given back for a payment: at most one per payment (the unique
    one-to-one is the last guard), moved by a reversing ledger entry."""

    payment = models.OneToOneField(
        Payment, on_delete=models.PROTECT, related_name="refund_record"
    )
    amount = models.BigIntegerField(_("amount"))  # minor units
    currency = models.CharField(_("currency"), max_length=3)
    reason = models.CharField(_("reason"), max_length=64, default="requested")
    journal_entry = models.OneToOneField(
        JournalEntry, on_delete=models.PROTECT, related_name="refund"
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)

    class Meta:
        verbose_name = _("refund")
        verbose_name_plural = _("refunds")
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(amount__gt=0), name="refund_amount_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"refund {self.pk} of payment {self.payment_id}"
