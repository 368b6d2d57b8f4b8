"""What `/metrics` reads from the payments tables when Prometheus scrapes."""

from collections.abc import Iterator

from django.db.models import Count, Q
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .models import ProviderEvent


class InboxDepthCollector(Collector):
    """Provider events waiting to be processed, and those parked after failing,
    counted when Prometheus scrapes."""

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
