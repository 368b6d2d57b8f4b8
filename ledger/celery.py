import os

from celery import Celery
from celery.signals import worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ledger.settings")

app = Celery("ledger")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
def _declare_dead_letter_queue(**_: object) -> None:
    """On RabbitMQ the task queue dead-letters into `celery.dead`: make sure it exists
    before the first message could need it (ledger/broker.py)."""
    if app.conf.task_queues and app.conf.broker_url.partition(":")[0] in {
        "amqp",
        "amqps",
        "pyamqp",
    }:
        from ledger.broker import declare_dead_letter_queue

        with app.connection_for_write() as connection:
            declare_dead_letter_queue(connection)
