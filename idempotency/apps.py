from django.apps import AppConfig


class IdempotencyConfig(AppConfig):
    name = "idempotency"
    verbose_name = "Idempotency"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the settings checks)
