from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from idempotency.management.arguments import MAX_BATCH, MAX_SECONDS, check_range
from orders.services import preorder_purge_expired


class Command(BaseCommand):
    help = "Delete pre-orders expired unused, in batches (what beat runs hourly)."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--grace-seconds", type=int, default=settings.PREORDER_PURGE_AFTER_SECONDS
        )
        parser.add_argument("--batch-size", type=int, default=1000)
        parser.add_argument("--max-seconds", type=float, default=300.0)

    def handle(
        self,
        *args,
        grace_seconds: int,
        batch_size: int,
        max_seconds: float,
        **options,
    ) -> None:
        # (The grace's lower bound is the service's, which says why.)
        check_range("grace-seconds", grace_seconds, -MAX_SECONDS, MAX_SECONDS)
        check_range("batch-size", batch_size, 1, MAX_BATCH)
        check_range("max-seconds", max_seconds, 0, MAX_SECONDS)
        try:
            deleted = preorder_purge_expired(
                grace_seconds=grace_seconds,
                batch_size=batch_size,
                max_seconds=max_seconds,
            )
        except ValueError as refused:
            raise CommandError(str(refused)) from None
        self.stdout.write(f"deleted {deleted} unused expired pre-order(s)")
