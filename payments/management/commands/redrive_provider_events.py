"""Process parked provider callbacks again, once each, after their cause is fixed."""

import json

from django.core.management.base import BaseCommand, CommandError

from payments.models import ProviderEvent
from payments.services import provider_event_redrive


class Command(BaseCommand):
    help = (
        "Process parked provider callbacks again, once each: every parked one, or "
        "those named by --event. Prints one JSON line per event; exits 1 if a named "
        "event is unknown or an event failed again. Safe to run twice."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--event",
            action="append",
            dest="events",
            metavar="EVENT_ID",
            help="the provider's event id (repeatable); default: every parked event",
        )

    def handle(self, *args, events: list[str] | None = None, **options) -> None:
        if events:
            names = list(dict.fromkeys(events))
            sane = [e for e in names if 0 < len(e) <= 128 and "\x00" not in e]
            found = dict(
                ProviderEvent.objects.filter(event_id__in=sane).values_list(
                    "event_id", "pk"
                )
            )
            unknown = [e for e in names if e not in found]
            if unknown:
                raise CommandError(
                    f"unknown provider event(s): {', '.join(map(repr, unknown))}",
                    returncode=1,
                )
            ids = [found[e] for e in names]
        else:
            ids = list(
                ProviderEvent.objects.filter(status=ProviderEvent.Status.PARKED)
                .order_by("pk")
                .values_list("pk", flat=True)
            )
        failed = 0
        for pk in ids:
            event, redriven = provider_event_redrive(event_id=pk)
            if redriven and event.status != ProviderEvent.Status.PROCESSED:
                failed += 1
            line = {
                "event_id": event.event_id,
                "redriven": redriven,
                "status": event.status,
                "outcome": event.outcome,
                "attempts": event.attempts,
                "last_error": event.last_error,
            }
            self.stdout.write(json.dumps(line, sort_keys=True))
        if failed:
            raise CommandError(f"{failed} event(s) failed again", returncode=1)
