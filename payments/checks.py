"""The default hold duration, refused at start-up rather than on the first manual
capture: the API takes 60..2592000 seconds, and so must its default."""

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
