"""Re-drive parked provider payments again, once each, after their cause is fixed."""

import json

from django.core.management.base import BaseCommand, CommandError

from ledger.exceptions import DomainError
from payments.exceptions import ProviderUnavailable
from payments.models import Payment
from payments.selectors import payments_parked
from payments.services import payment_redrive_parked

BIGINT_MAX = 2**63 - 1


class Command(BaseCommand):
    help = (
        "Re-drive parked provider payments (their re-drive refused by the ledger "
        "PAYMENT_REDRIVE_MAX_ATTEMPTS times) once each: ask the provider again and "
        "apply its answer. Every parked one, or those named by --payment. Prints "
        "one JSON line per payment; exits 1 if a named payment is unknown or a "
        "re-drive was refused again (a provider that does not answer stops it: the "
        "rest stay parked). Safe to run twice, or twice at once."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--payment",
            action="append",
            dest="payments",
            metavar="PAYMENT_ID",
            help="a payment's id, as the admin shows it (repeatable); default: "
            "every parked payment",
        )

    def handle(self, *args, payments: list[str] | None = None, **options) -> None:
        if payments:
            names = list(dict.fromkeys(payments))
            sane = {
                name: int(name)
                for name in names
                if name.isascii() and name.isdigit() and 0 < int(name) <= BIGINT_MAX
            }
            found = set(
                Payment.objects.filter(pk__in=sane.values()).values_list(
                    "pk", flat=True
                )
            )
            unknown = [name for name in names if sane.get(name) not in found]
            if unknown:
                raise CommandError(
                    f"unknown payment(s): {', '.join(map(repr, unknown))}",
                    returncode=1,
                )
            ids = list(dict.fromkeys(sane[name] for name in names))
        else:
            ids = list(payments_parked().values_list("pk", flat=True))
        failed = left = 0
        for done, pk in enumerate(ids):
            # Outside any transaction: the re-drive asks the provider.
            try:
                payment, redriven = payment_redrive_parked(payment_id=pk)
            except DomainError as refused:
                # Unparked already: beat re-drives it from now on. A provider that
                # does not answer would not for the rest either: they stay parked.
                failed += 1
                line = {"payment": pk, "redriven": True, "error": refused.code}
                self.stdout.write(json.dumps(line, sort_keys=True))
                if isinstance(refused, ProviderUnavailable):
                    left = len(ids) - done - 1
                    break
                continue
            if redriven and payment.redrive_attempts:
                failed += 1  # refused again: counted as a first attempt
            line = {
                "payment": payment.pk,
                "redriven": redriven,
                "status": payment.status,
                "parked": payment.redrive_parked_at is not None,
                "redrive_attempts": payment.redrive_attempts,
                "redrive_error": payment.redrive_error,
            }
            self.stdout.write(json.dumps(line, sort_keys=True))
        if failed:
            untried = f"; {left} not tried, still parked" if left else ""
            raise CommandError(
                f"{failed} payment(s) refused again{untried}", returncode=1
            )
