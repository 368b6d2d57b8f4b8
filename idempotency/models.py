"""The idempotency key record: what a key was used for and how it ended.

One row per (scope, key); the database's unique constraint, not a read-then-write,
decides which of two concurrent requests owns a key.
"""

from datetime import datetime

from django.db import models
from django.db.models import Q

from .sql import DatabaseNow


class RecordQuerySet(models.QuerySet["IdempotencyRecord"]):
    def expired(self) -> "RecordQuerySet":
        """Finished records past their time to live (by the database's clock): see
        `IdempotencyRecord.expired`."""
        return self.filter(expires_at__lte=DatabaseNow()).exclude(
            status=IdempotencyRecord.Status.PROCESSING
        )


class IdempotencyRecord(models.Model):
    class Status(models.TextChoices):
        PROCESSING = "processing", "Processing"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"

    # Who the key belongs to ("user:<pk>"): two users may use the same key.
    scope = models.CharField(max_length=64)
    key = models.CharField(max_length=255)
    # Which endpoint (the decorator's name) and request it was first used for.
    endpoint = models.CharField(max_length=100)
    method = models.CharField(max_length=10)
    path = models.TextField()  # as long as the URL the client sent
    fingerprint = models.CharField(max_length=64)
    # A short hash of each top-level body field, so a 422 can name what changed
    # without keeping the request body itself.
    request_fields = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=Status.choices)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_headers = models.JSONField(default=dict)
    response_body = models.BinaryField(null=True, blank=True)
    # Multi-phase work: the last phase that committed, and what it needs to resume.
    recovery_point = models.CharField(max_length=64, default="started")
    recovery_data = models.JSONField(default=dict)
    # The lease of an in-flight multi-phase request; a retry may take the key over
    # once it has passed. Its exact value doubles as the lease holder's token.
    locked_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # IDEMPOTENCY_TTL_SECONDS after the request finished.
    expires_at = models.DateTimeField(db_index=True)

    objects = RecordQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["scope", "key"], name="idempotency_scope_key"
            ),
        ]
        indexes = [
            models.Index(
                fields=["locked_until"],
                condition=Q(status="processing"),
                name="idempotency_in_flight",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.scope} {self.key} ({self.status})"

    @property
    def finished(self) -> bool:
        return self.status != self.Status.PROCESSING

    def expired(self, now: datetime) -> bool:
        """Past its time to live, the key is forgotten (even before the purge runs).
        A record still processing never expires: past its first recovery point it is
        the only memory of effects that committed, and forgetting it would let a retry
        run them again. Stuck ones are `record_release_stuck`'s to deal with."""
        return self.finished and self.expires_at <= now


class Lease(models.Model):
    """A named lease held by one process until `expires_at`, by the database's clock.

    Worker ids of the Snowflake generator (`snowflake:<id>`, one row per id) and the
    beat leader (`beat`) are leases. Only `idempotency.leases` writes these rows, in
    single statements whose times all come from the database's clock, so a host whose
    clock runs fast or slow can neither steal a live lease nor keep a dead one.
    """

    name = models.CharField(max_length=100, primary_key=True)
    # host:pid:random token; the token tells apart two holders with the same pid.
    holder = models.CharField(max_length=200)
    acquired_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} held by {self.holder} until {self.expires_at}"
