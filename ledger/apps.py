from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class LedgerConfig(AppConfig):
    name = "ledger"
    verbose_name = _("Ledger")

    def ready(self) -> None:
        # Connect the Celery task signals (metrics and the task log line) in every
        # process: web, worker and beat.
        from . import checks, metrics  # noqa: F401  (checks registers itself)
