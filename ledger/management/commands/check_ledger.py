import json

from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from ledger.invariants import ledger_report


class Command(BaseCommand):
    help = (
        "Prove the ledger's invariants; exit 1 and name each violation otherwise. "
        "Warnings (e.g. parked provider callbacks) are listed, and exit 0."
    )

    def handle(self, *args, **options) -> None:
        executor = MigrationExecutor(connection)
        if executor.migration_plan(executor.loader.graph.leaf_nodes()):
            # (An empty or old database: its tables are missing, not its money.)
            raise CommandError(
                f"{connection.settings_dict['NAME']} has migrations not applied: "
                "run `manage.py migrate` first, then check the ledger",
                returncode=3,  # (1 is a violation, 2 a command line argparse refused)
            )
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
