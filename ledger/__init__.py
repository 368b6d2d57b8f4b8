"""The Django project package and the double-entry ledger at its core."""

from .celery import app as celery_app

__all__ = ("celery_app",)
