import json

from django.core.management.base import BaseCommand, CommandError

from ledger.broker import DEAD_LETTERS, dead_letters
from ledger.celery import app


class Command(BaseCommand):
    help = (
        f"List the tasks in RabbitMQ's dead-letter queue ({DEAD_LETTERS}): messages "
        "delivered CELERY_DELIVERY_LIMIT times without finishing. With --requeue, "
        "send them back to the task queue once the cause is fixed."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--requeue", action="store_true")

    def handle(self, *args, requeue: bool, **options) -> None:
        if not app.conf.task_queues:
            raise CommandError(
                "the dead-letter queue exists only with RabbitMQ "
                "(CELERY_BROKER_URL=amqp://...)"
            )
        with app.connection_for_write() as connection:
            found = dead_letters(connection, requeue=requeue)
        self.stdout.write(
            json.dumps(
                {
                    "queue": DEAD_LETTERS,
                    "count": len(found),
                    "requeued": requeue,
                    "messages": found,
                },
                sort_keys=True,
            )
        )
