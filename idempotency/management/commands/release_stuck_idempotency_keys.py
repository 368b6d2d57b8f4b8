from django.core.management.base import BaseCommand

from idempotency.management.arguments import MAX_SECONDS, check_range
from idempotency.services import record_release_stuck


class Command(BaseCommand):
    help = "Release idempotency keys stuck in processing past their lease."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--grace-seconds", type=int, default=60)

    def handle(self, *args, grace_seconds: int, **options) -> None:
        # Negative, it would release keys whose requests still hold a live lease.
        check_range("grace-seconds", grace_seconds, 0, MAX_SECONDS)
        released = record_release_stuck(grace_seconds=grace_seconds)
        self.stdout.write(f"released {released} stuck key record(s)")
