from django.apps import AppConfig


class OrdersConfig(AppConfig):
    name = "orders"
    verbose_name = "Orders"

    def ready(self) -> None:
        # Registers the settings checks, the demo products and check_ledger's checks.
        from . import checks, demo, invariants  # noqa: F401
