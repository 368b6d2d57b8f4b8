from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "ledger"
    verbose_name = "Ledger"

    def ready(self) -> None:
        # Connect the Celery task signals (metrics and the task log line) in every
        # process: web, worker and beat.
        from . import metrics  # noqa: F401
