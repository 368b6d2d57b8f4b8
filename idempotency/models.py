"""The idempotency key record: what a key was used for and how it ended.

One row per (scope, key); the database's unique constraint, not a read-then-write,
decides which of two concurrent requests owns a key.
"""

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from .sql import DatabaseNow


class OpaqueCharField(models.CharField):
    """Text that is a token, not language: compared byte for byte.

    An idempotency key (printable ASCII) and its scope are never sorted or matched as
    words. On PostgreSQL the column is `COLLATE "C"`, so each comparison is a
    `memcmp`. Under the database's default collation (a libc locale such as
    `C.UTF-8` or `en_US.UTF-8`) each one calls `strcoll`, and a descent of the unique
    index makes several per level, so every level the index grows by costs more (the
    README's "Growth" measures both). Equality is the same either way (a
    deterministic collation breaks ties byte for byte). SQLite compares bytes already.
    """

    def db_parameters(self, connection: Any) -> dict[str, Any]:
        parameters = super().db_parameters(connection)
        if connection.vendor == "postgresql" and self.db_collation is None:
            parameters["collation"] = "C"
        return parameters


class RecordQuerySet(models.QuerySet["IdempotencyRecord"]):
    def expired(self) -> "RecordQuerySet":
        """Finished records past their time to live (by the database's clock): see
        `IdempotencyRecord.expired`."""
        return self.filter(expires_at__lte=DatabaseNow()).exclude(
            status=IdempotencyRecord.Status.PROCESSING
        )


class IdempotencyRecord(models.Model):
    class Status(models.TextChoices):
        PROCESSING = "processing", _("Processing")
        SUCCEEDED = "succeeded", _("Succeeded")
        FAILED = "failed", _("Failed")

    # Who the key belongs to ("user:<pk>"): two users may use the same key.
    scope = OpaqueCharField(_("scope"), max_length=64)
    key = OpaqueCharField(_("key"), max_length=255)
    # Which endpoint (the decorator's name) and request it was first used for.
    endpoint = models.CharField(_("endpoint"), max_length=100)
    method = models.CharField(_("method"), max_length=10)
    path = models.TextField(_("path"))  # as long as the URL the client sent
    fingerprint = models.CharField(_("fingerprint"), max_length=64)
    # A short hash of each top-level body field, so a 422 can name what changed
    # without keeping the request body itself.
    request_fields = models.JSONField(_("request fields"), default=dict)
    status = models.CharField(_("status"), max_length=16, choices=Status.choices)
    response_status = models.PositiveSmallIntegerField(
        _("response status"), null=True, blank=True
    )
    response_headers = models.JSONField(_("response headers"), default=dict)
    response_body = models.BinaryField(_("response body"), null=True, blank=True)
    # Multi-phase work: the last phase that committed, and what it needs to resume.
    recovery_point = models.CharField(
        _("recovery point"), max_length=64, default="started"
    )
    recovery_data = models.JSONField(_("recovery data"), default=dict)
    # The lease of an in-flight multi-phase request; a retry may take the key over
    # once it has passed. Its exact value doubles as the lease holder's token.
    locked_until = models.DateTimeField(_("locked until"), null=True, blank=True)
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    # IDEMPOTENCY_TTL_SECONDS after the request finished.
    expires_at = models.DateTimeField(_("expires"), db_index=True)

    objects = RecordQuerySet.as_manager()

    class Meta:
        verbose_name = _("idempotency record")
        verbose_name_plural = _("idempotency records")
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

    @property
    def forgettable(self) -> bool:
        """Still before its first recovery point: nothing but the record itself has
        committed, so forgetting it lets a retry run afresh and nothing twice. Past
        a recovery point, or finished, the record is the only memory of effects that
        committed: forgetting it would let a retry run them again."""
        return self.status == self.Status.PROCESSING and self.recovery_point == STARTED


# The recovery point of a phased record that has committed nothing but itself.
STARTED = "started"


class AuditEntry(models.Model):
    """Who did what to which key, and when: written in the same transaction as the
    change it records, kept when the key record is gone."""

    class Action(models.TextChoices):
        FORGET = "forget", _("Forgot the key")

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name=_("who"),
        null=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    # The username at the time: the audit outlives a renamed or deleted user.
    actor_name = models.CharField(_("username"), max_length=150)
    at = models.DateTimeField(_("when"), auto_now_add=True, db_index=True)
    action = models.CharField(_("what"), max_length=16, choices=Action.choices)
    scope = models.CharField(_("scope"), max_length=64)
    key = models.CharField(_("key"), max_length=255)
    endpoint = models.CharField(_("endpoint"), max_length=100)
    # The record as it was when it was changed.
    record = models.JSONField(_("record"), default=dict)

    class Meta:
        verbose_name = _("audit log entry")
        verbose_name_plural = _("audit log")
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"{self.actor_name} {self.action} {self.scope} {self.key}"


class Lease(models.Model):
    """A named lease held by one process until `expires_at`, by the database's clock.

    Worker ids of the Snowflake generator (`snowflake:<id>`, one row per id) and the
    beat leader (`beat`) are leases. Only `idempotency.leases` writes these rows, in
    single statements whose times all come from the database's clock, so a host whose
    clock runs fast or slow can neither steal a live lease nor keep a dead one.
    """

    name = models.CharField(_("name"), max_length=100, primary_key=True)
    # host:pid:random token; the token tells apart two holders with the same pid.
    holder = models.CharField(_("holder"), max_length=200)
    acquired_at = models.DateTimeField(_("acquired"))
    expires_at = models.DateTimeField(_("expires"))

    class Meta:
        verbose_name = _("lease")
        verbose_name_plural = _("leases")

    def __str__(self) -> str:
        return f"{self.name} held by {self.holder} until {self.expires_at}"
