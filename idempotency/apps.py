from django.apps import AppConfig


class IdempotencyConfig(AppConfig):
    name = "idempotency"
    verbose_name = "Idempotency"

    def ready(self) -> None:
        # Registers the settings checks, and the receivers that revoke API tokens
        # in the Redis replay shortcut.
        from . import checks, signals  # noqa: F401
