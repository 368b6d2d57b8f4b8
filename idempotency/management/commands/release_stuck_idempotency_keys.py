from django.core.management.base import BaseCommand

from idempotency.services import record_release_stuck


class Command(BaseCommand):
    help = "Release idempotency keys stuck in processing past their lease."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--grace-seconds", type=int, default=60)

    def handle(self, *args, grace_seconds: int, **options) -> None:
        released = record_release_stuck(grace_seconds=grace_seconds)
        self.stdout.write(f"released {released} stuck key record(s)")
