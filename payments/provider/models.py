"""The simulator's own storage: charges and the callbacks it owes the merchant."""

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _


class Charge(models.Model):
    class Status(models.TextChoices):
        PENDING = "PENDING", _("Pending")
        SUCCESS = "SUCCESS", _("Success")
        FAILED = "FAILED", _("Failed")
        # The merchant cancelled it: the payer can no longer confirm it.
        CANCELLED = "CANCELLED", _("Cancelled")
        # Paid, then the merchant gave the money back to the payer.
        REFUNDED = "REFUNDED", _("Refunded")

    txn_id = models.CharField(_("transaction"), max_length=64, unique=True)
    # The merchant's idempotency key: one charge per merchant order number.
    merchant_order_no = models.CharField(
        _("merchant order number"), max_length=64, unique=True
    )
    amount = models.BigIntegerField(_("amount"))
    currency = models.CharField(_("currency"), max_length=3)
    description = models.CharField(_("description"), max_length=255, blank=True)
    # Where the payer goes back to once done: the merchant's order page, given by
    # the merchant when it opens the charge (as real providers take a return URL).
    return_url = models.URLField(_("return URL"), max_length=500, blank=True)
    status = models.CharField(
        _("status"), max_length=16, choices=Status.choices, default=Status.PENDING
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    settled_at = models.DateTimeField(_("settled"), null=True, blank=True)
    refunded_at = models.DateTimeField(_("refunded"), null=True, blank=True)

    class Meta:
        verbose_name = _("charge")
        verbose_name_plural = _("charges")

    def __str__(self) -> str:
        return f"{self.txn_id} ({self.status})"


class Notification(models.Model):
    """A callback the provider must deliver until the merchant answers 200."""

    charge = models.ForeignKey(
        Charge,
        verbose_name=_("charge"),
        on_delete=models.CASCADE,
        related_name="notifications",
    )
    event_id = models.CharField(_("event id"), max_length=128, unique=True)
    # What the event reports, fixed when it is made: every delivery of it says the
    # same, though the charge may move on (declined, then reopened and paid).
    outcome = models.CharField(_("outcome"), max_length=16, blank=True)
    attempts = models.PositiveIntegerField(_("delivery attempts"), default=0)
    last_status = models.IntegerField(_("last answer"), null=True, blank=True)
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    delivered_at = models.DateTimeField(_("delivered"), null=True, blank=True)

    class Meta:
        verbose_name = _("notification")
        verbose_name_plural = _("notifications")
        indexes = [
            models.Index(  # beat's redelivery of the ones lost on the way
                fields=["created_at"],
                condition=Q(delivered_at__isnull=True),
                name="notification_undelivered",
            ),
        ]

    def __str__(self) -> str:
        return self.event_id
