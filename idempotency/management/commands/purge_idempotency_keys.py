from django.core.management.base import BaseCommand

from idempotency.services import record_purge_expired


class Command(BaseCommand):
    help = "Delete expired idempotency key records in batches (what beat runs hourly)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--batch-size", type=int, default=1000)
        parser.add_argument("--max-seconds", type=float, default=300.0)

    def handle(self, *args, batch_size: int, max_seconds: float, **options) -> None:
        deleted = record_purge_expired(batch_size=batch_size, max_seconds=max_seconds)
        self.stdout.write(f"deleted {deleted} expired key record(s)")
