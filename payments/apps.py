from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class PaymentsConfig(AppConfig):
    name = "payments"
    verbose_name = _("Payments")

    def ready(self) -> None:
        # Registers "no order paid twice" with `check_ledger`, and the inbox's
        # gauges with `/metrics`.
        from ledger.metrics import register_scrape_collector

        from . import invariants  # noqa: F401
        from .metrics import InboxDepthCollector

        register_scrape_collector(InboxDepthCollector())
