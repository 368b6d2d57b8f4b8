from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ProviderConfig(AppConfig):
    name = "payments.provider"
    label = "provider_sim"
    verbose_name = _("Payment provider (simulator)")
