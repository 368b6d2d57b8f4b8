"""Payments' settings, refused at start-up rather than found wrong later: the
default hold duration (the API takes 60..2592000 seconds, and so must its default)
and the reconciliation of settled payments (beat's batches)."""

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
