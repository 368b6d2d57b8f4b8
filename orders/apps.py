from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class OrdersConfig(AppConfig):
    name = "orders"
    verbose_name = _("Orders")

    def ready(self) -> None:
        # Registers the settings checks, the demo products and check_ledger's checks.
        from . import checks, demo, invariants  # noqa: F401
