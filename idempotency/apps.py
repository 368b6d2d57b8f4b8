from django.apps import AppConfig
from django.db.models.signals import post_migrate
from django.utils.translation import gettext_lazy as _


class IdempotencyConfig(AppConfig):
    name = "idempotency"
    verbose_name = _("Idempotency")

    def ready(self) -> None:
        # Registers the settings checks, and the receivers that revoke API tokens
        # in the Redis replay shortcut.
        from . import checks, signals  # noqa: F401
        from .snowflake import forget_worker_lease

        # A flushed or re-created table has forgotten this process's worker id
        # lease (a test database): lease a fresh one rather than trust it.
        post_migrate.connect(lambda **_: forget_worker_lease(), sender=self, weak=False)
