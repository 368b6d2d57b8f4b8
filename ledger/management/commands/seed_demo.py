import json

from django.core.management.base import BaseCommand

from ledger.demo import demo_seed


class Command(BaseCommand):
    help = "Create the demo customer (funded wallet) and an admin; print how to log in."

    def handle(self, *args, **options) -> None:
        self.stdout.write(json.dumps(demo_seed()))
