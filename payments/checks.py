"""Payments' settings, refused at start-up rather than found wrong later: the
default hold duration (the API takes 60..2592000 seconds, and so must its default),
the reconciliation of settled payments (beat's batches) and the refused re-drives
a payment is parked after."""

from typing import Any

from django.conf import settings
from django.core import checks

from .services import HOLD_SECONDS_MAX, HOLD_SECONDS_MIN


@checks.register()
def hold_ttl_in_range(**kwargs: Any) -> list[checks.CheckMessage]:
    ttl = settings.HOLD_TTL_SECONDS
    if HOLD_SECONDS_MIN <= ttl <= HOLD_SECONDS_MAX:
        return []
    return [
        checks.Error(
            f"HOLD_TTL_SECONDS = {ttl}: outside what a hold may last",
            hint=f"use {HOLD_SECONDS_MIN}..{HOLD_SECONDS_MAX} seconds",
            id="payments.E001",
        )
    ]


RECONCILE_SETTINGS = (
    "PAYMENT_RECONCILE_WINDOW_SECONDS",
    "PAYMENT_RECONCILE_EVERY_SECONDS",
    "PAYMENT_RECONCILE_BATCH",
)


@checks.register()
def reconcile_settings_positive(**kwargs: Any) -> list[checks.CheckMessage]:
    """A zero window or batch would quietly stop beat from finding charges refunded
    at the provider; a zero interval would ask about every one each minute."""
    return [
        checks.Error(
            f"{name} = {getattr(settings, name)}: must be positive",
            hint="beat's reconciliation of settled payments needs it",
            id="payments.E002",
        )
        for name in RECONCILE_SETTINGS
        if getattr(settings, name) <= 0
    ]


# `Payment.redrive_attempts` is a PostgreSQL smallint.
REDRIVE_ATTEMPTS_MAX = 32767


@checks.register()
def redrive_max_attempts_in_range(**kwargs: Any) -> list[checks.CheckMessage]:
    """Under one, a payment is parked at its first refusal whatever the setting
    says; over the column's range, the count of refusals cannot reach it: its update
    fails every minute once the column is full, and the payment is never parked."""
    attempts = settings.PAYMENT_REDRIVE_MAX_ATTEMPTS
    if 1 <= attempts <= REDRIVE_ATTEMPTS_MAX:
        return []
    return [
        checks.Error(
            f"PAYMENT_REDRIVE_MAX_ATTEMPTS = {attempts}: outside what can be counted",
            hint=f"use 1..{REDRIVE_ATTEMPTS_MAX} refused re-drives",
            id="payments.E003",
        )
    ]
