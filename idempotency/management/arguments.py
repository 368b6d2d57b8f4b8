"""The housekeeping commands' numeric options, checked before anything is deleted."""

from django.core.management.base import CommandError

# The longest grace or run a command takes: ten years, well inside what a
# `timedelta` holds (a larger one failed with a traceback).
MAX_SECONDS = 10 * 365 * 86400
# The largest batch: one transaction of the delete must stay short.
MAX_BATCH = 100_000


def check_range(option: str, value: float, low: float, high: float) -> None:
    """Refuse (`CommandError`) `--option` outside `low`..`high` (NaN included)."""
    if not low <= value <= high:
        raise CommandError(f"--{option} is {low} to {high}, not {value}")
