from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class IdempotencyConfig(AppConfig):
    name = "idempotency"
    verbose_name = _("Idempotency")

    def ready(self) -> None:
        # Registers the settings checks, and the receivers that revoke API tokens
        # in the Redis replay shortcut.
        from . import checks, signals  # noqa: F401
