from django.apps import AppConfig


class PaymentsConfig(AppConfig):
    name = "payments"
    verbose_name = "Payments"

    def ready(self) -> None:
        # Registers "no order paid twice" with `check_ledger`.
        from . import invariants  # noqa: F401
