from django.apps import AppConfig


class PaymentsConfig(AppConfig):
    name = "payments"
    verbose_name = "Payments"

    def ready(self) -> None:
        # Registers "no order paid twice" with `check_ledger`, and the inbox's
        # gauges with `/metrics`.
        from ledger.metrics import register_scrape_collector

        from . import invariants  # noqa: F401
        from .metrics import InboxDepthCollector

        register_scrape_collector(InboxDepthCollector())
