"""The simulator's own storage: charges and the callbacks it owes the merchant."""

from django.db import models


class Charge(models.Model):
    class Status(models.TextChoices):
        PENDING = "PENDING", "Pending"
        SUCCESS = "SUCCESS", "Success"
        FAILED = "FAILED", "Failed"
        # The merchant cancelled it: the payer can no longer confirm it.
        CANCELLED = "CANCELLED", "Cancelled"

    txn_id = models.CharField(max_length=64, unique=True)
    # The merchant's idempotency key: one charge per merchant order number.
    merchant_order_no = models.CharField(max_length=64, unique=True)
    amount = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    description = models.CharField(max_length=255, blank=True)
    # Where the payer goes back to once done: the merchant's order page, given by
    # the merchant when it opens the charge (as real providers take a return URL).
    return_url = models.URLField(max_length=500, blank=True)
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.PENDING
    )
    created_at = models.DateTimeField(auto_now_add=True)
    settled_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.txn_id} ({self.status})"


class Notification(models.Model):
    """A callback the provider must deliver until the merchant answers 200."""

    charge = models.ForeignKey(
        Charge, on_delete=models.CASCADE, related_name="notifications"
    )
    event_id = models.CharField(max_length=128, unique=True)
    attempts = models.PositiveIntegerField(default=0)
    last_status = models.IntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.event_id
