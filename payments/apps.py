from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class PaymentsConfig(AppConfig):
    name = "payments"
    verbose_name = _("Payments")

    def ready(self) -> None:
        # Registers "no order paid twice" with `check_ledger`, and the inbox's
        # and the parked payments' gauges with `/metrics`.
        from ledger.metrics import register_scrape_collector
        from orders.services import order_cancel_listener, order_releaser

        from . import checks, invariants  # noqa: F401
        from .metrics import InboxDepthCollector, ParkedPaymentsCollector
        from .services import payment_cancel_open_charges_later, payment_void_for_order

        register_scrape_collector(InboxDepthCollector())
        register_scrape_collector(ParkedPaymentsCollector())
        # Cancelling an authorized order voids its payment and releases the hold.
        order_releaser(payment_void_for_order)
        # Cancelling an order with a provider payment open cancels its charge.
        order_cancel_listener(payment_cancel_open_charges_later)
