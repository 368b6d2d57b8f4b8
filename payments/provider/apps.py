from django.apps import AppConfig


class ProviderConfig(AppConfig):
    name = "payments.provider"
    label = "provider_sim"
    verbose_name = "Payment provider (simulator)"
