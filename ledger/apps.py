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

        name_tokens_by_prefix()


def name_tokens_by_prefix() -> None:
    """DRF names a token by its key: every admin page that names one (the token
    list, its change, history and delete pages, a user's delete page listing what
    goes with them, the "was deleted" message, the recent-actions log) showed the
    secret, as would any log line or error report that prints one. Named by its
    prefix instead; the key is still `token.key`."""
    from rest_framework.authtoken.models import Token

    from .auth import token_prefix

    def named(token: Token) -> str:
        return token_prefix(token.key)

    Token.__str__ = named  # type: ignore[method-assign,assignment]


class AdminConfig(admin_apps.AdminConfig):
    """Django's admin, on the back office's own site (ledger.adminsite)."""

    default = False  # (ledger's own configuration is LedgerConfig)
    default_site = "ledger.adminsite.AdminSite"
