"""What `/metrics` reads from the payments tables when Prometheus scrapes."""

from collections.abc import Iterator

from django.db.models import Count, Q
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .models import ProviderEvent
from .selectors import payments_parked


class InboxDepthCollector(Collector):
    """Provider events waiting to be processed, those parked after failing, and
    those about a charge that was not their payment's, counted when Prometheus
    scrapes."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        status = ProviderEvent.Status
        try:
            counts = ProviderEvent.objects.filter(
                status__in=[status.RECEIVED, status.PARKED]
            ).aggregate(
                received=Count("pk", filter=Q(status=status.RECEIVED)),
                parked=Count("pk", filter=Q(status=status.PARKED)),
            )
        except Exception:  # the database is down: say nothing rather than fail
            return
        depth = GaugeMetricFamily(
            "payments_callback_inbox_depth",
            "Provider callbacks stored and not yet processed.",
        )
        depth.add_metric([], counts["received"])
        yield depth
        parked = GaugeMetricFamily(
            "payments_provider_events_parked",
            "Provider callbacks parked after failing PROVIDER_EVENT_MAX_ATTEMPTS "
            "times; an operator must re-drive them.",
        )
        parked.add_metric([], counts["parked"])
        yield parked
        try:
            # Through the partial index `provider_event_not_its_charge`.
            other = ProviderEvent.objects.filter(
                outcome=ProviderEvent.NOT_ITS_CHARGE
            ).count()
        except Exception:  # the database is down: say nothing rather than fail
            return
        not_its = GaugeMetricFamily(
            "payments_provider_events_not_its_charge",
            "Provider callbacks about a charge that is not their payment's: "
            "processed changing nothing; staff look into them (admin outcome filter).",
        )
        not_its.add_metric([], other)
        yield not_its


class ParkedPaymentsCollector(Collector):
    """Provider payments whose re-drive is parked for staff, counted when
    Prometheus scrapes (through the partial index `payment_redrive_parked`)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            count = payments_parked().count()
        except Exception:  # the database is down: say nothing rather than fail
            return
        parked = GaugeMetricFamily(
            "payments_provider_payments_parked",
            "Provider payments whose re-drive the ledger refused "
            "PAYMENT_REDRIVE_MAX_ATTEMPTS times; staff must re-drive them.",
        )
        parked.add_metric([], count)
        yield parked
