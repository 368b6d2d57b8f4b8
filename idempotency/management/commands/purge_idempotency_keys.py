from django.core.management.base import BaseCommand

from idempotency.management.arguments import MAX_BATCH, MAX_SECONDS, check_range
from idempotency.services import record_purge_expired


class Command(BaseCommand):
    help = (
        "Delete expired idempotency key records in batches, resting between them "
        "(what beat runs every five minutes)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--batch-size", type=int, default=500)
        parser.add_argument("--max-seconds", type=float, default=300.0)
        parser.add_argument(
            "--rest", type=float, default=10.0, help="rest per second of work"
        )

    def handle(
        self, *args, batch_size: int, max_seconds: float, rest: float, **options
    ) -> None:
        check_range("batch-size", batch_size, 1, MAX_BATCH)
        check_range("max-seconds", max_seconds, 0, MAX_SECONDS)
        check_range("rest", rest, 0, 100)
        deleted = record_purge_expired(
            batch_size=batch_size, max_seconds=max_seconds, rest=rest
        )
        self.stdout.write(f"deleted {deleted} expired key record(s)")
