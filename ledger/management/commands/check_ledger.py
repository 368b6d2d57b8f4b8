import json

from django.core.management.base import BaseCommand, CommandError

from ledger.invariants import ledger_report


class Command(BaseCommand):
    help = (
        "Prove the ledger's invariants; exit 1 and name each violation otherwise. "
        "Warnings (e.g. parked provider callbacks) are listed, and exit 0."
    )

    def handle(self, *args, **options) -> None:
        report = ledger_report()
        self.stdout.write(json.dumps(report, sort_keys=True))
        for warning in report["warnings"]:
            self.stderr.write(f"warning: {warning}")
        if not report["ok"]:
            for violation in report["violations"]:
                self.stderr.write(f"violation: {violation}")
            raise CommandError(
                f"{len(report['violations'])} ledger invariant(s) violated",
                returncode=1,
            )
