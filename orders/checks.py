"""The pre-order purge's grace, refused at start-up rather than when the task runs."""

from typing import Any

from django.conf import settings
from django.core import checks

from .services import PREORDER_PURGE_MIN_GRACE_SECONDS


@checks.register()
def preorder_purge_grace(**kwargs: Any) -> list[checks.CheckMessage]:
    grace = settings.PREORDER_PURGE_AFTER_SECONDS
    if grace >= PREORDER_PURGE_MIN_GRACE_SECONDS:
        return []
    return [
        checks.Error(
            f"PREORDER_PURGE_AFTER_SECONDS = {grace}: the purge could delete a number "
            "an order is being created for",
            hint=f"use at least {PREORDER_PURGE_MIN_GRACE_SECONDS} seconds",
            id="orders.E001",
        )
    ]
