from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps
from django.utils.translation import gettext_lazy as _


class LedgerConfig(AppConfig):
    name = "ledger"
    verbose_name = _("Ledger")

    def ready(self) -> None:
        # Connect the Celery task signals (metrics and the task log line) in every
        # process: web, worker and beat.
        from . import checks, metrics  # noqa: F401  (checks registers itself)


class AdminConfig(admin_apps.AdminConfig):
    """Django's admin, on the back office's own site (ledger.adminsite)."""

    default = False  # (ledger's own configuration is LedgerConfig)
    default_site = "ledger.adminsite.AdminSite"
