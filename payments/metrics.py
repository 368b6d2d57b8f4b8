"""What `/metrics` reads from the payments tables when Prometheus scrapes."""

from collections.abc import Callable, Iterator

from django.db.models import Count, Q
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .models import ProviderEvent
from .selectors import payments_heard_of_another_charge, payments_parked


def _gauge(name: str, documentation: str, value: int) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(name, documentation)
    gauge.add_metric([], value)
    return gauge


def _counted(count: Callable[[], object]) -> object | None:
    """`count()`, or None when the database is down: a scrape then says nothing of
    it rather than fail."""
    try:
        return count()
    except Exception:
        return None


class InboxDepthCollector(Collector):
    """Provider events waiting to be processed, those parked after failing, and
    those about a charge that was not their payment's, counted when Prometheus
    scrapes."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        status = ProviderEvent.Status
        counts = _counted(
            lambda: ProviderEvent.objects.filter(
                status__in=[status.RECEIVED, status.PARKED]
            ).aggregate(
                received=Count("pk", filter=Q(status=status.RECEIVED)),
                parked=Count("pk", filter=Q(status=status.PARKED)),
            )
        )
        if not isinstance(counts, dict):
            return
        yield _gauge(
            "payments_callback_inbox_depth",
            "Provider callbacks stored and not yet processed.",
            counts["received"],
        )
        yield _gauge(
            "payments_provider_events_parked",
            "Provider callbacks parked after failing PROVIDER_EVENT_MAX_ATTEMPTS "
            "times; an operator must re-drive them.",
            counts["parked"],
        )
        # Through the partial index `provider_event_not_its_charge`.
        other = _counted(
            ProviderEvent.objects.filter(outcome=ProviderEvent.NOT_ITS_CHARGE).count
        )
        if isinstance(other, int):
            yield _gauge(
                "payments_provider_events_not_its_charge",
                "Provider callbacks about a charge that is not their payment's: "
                "processed changing nothing; staff look into them (admin filter "
                '"about another charge").',
                other,
            )


class ParkedPaymentsCollector(Collector):
    """Provider payments whose re-drive is parked for staff (through the partial
    index `payment_redrive_parked`), and those whose re-drive or reconciliation
    heard of a charge that is not theirs (`payment_other_charge_heard`), counted
    when Prometheus scrapes."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        count = _counted(payments_parked().count)
        if isinstance(count, int):
            yield _gauge(
                "payments_provider_payments_parked",
                "Provider payments whose re-drive the ledger refused "
                "PAYMENT_REDRIVE_MAX_ATTEMPTS times; staff must re-drive them.",
                count,
            )
        other = _counted(payments_heard_of_another_charge().count)
        if isinstance(other, int):
            yield _gauge(
                "payments_provider_answers_not_its_charge",
                "Provider payments whose re-drive or reconciliation heard of a "
                "charge that is not theirs, changing nothing; staff look into them "
                '(admin filter "answer about another charge").',
                other,
            )
