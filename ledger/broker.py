"""Celery on RabbitMQ (or Redis), set up for work that moves money.

- **Quorum queues.** The task queue is replicated by Raft across the broker's nodes, so
  a task the web process handed over survives the loss of a node. Celery sees the
  quorum queue and switches to per-consumer prefetch (quorum queues have no global
  QoS); `CELERY_WORKER_PREFETCH_MULTIPLIER = 1` keeps it at one message a process.
- **Native delayed delivery.** A countdown (a retry's backoff, a re-drive later) is
  published to the broker's delay exchanges (`celery_delayed_0..27`, one bit of the
  delay each), which hand the message to the queue when it is due. No worker holds a
  delayed task unacknowledged in memory, and the broker's redelivery of a worker's
  unacknowledged messages never fires a delayed task early. It needs a topic exchange.
- **A delivery limit and a dead-letter queue.** Tasks are acknowledged late, so a
  message whose worker dies while running it is delivered again: what we want for a
  worker killed by a deploy, and a loop for ever for a message that kills its worker
  every time. After `CELERY_DELIVERY_LIMIT` deliveries the broker moves it, at least
  once, to `celery.dead` instead, where `manage.py dead_letters` shows it and, once
  the cause is fixed, sends it back. Every task is idempotent, so a message delivered
  again or sent back from the dead-letter queue changes nothing twice.

On Redis, every wait on the broker's socket (connecting, each command's answer) is
bounded by `REDIS_SOCKET_TIMEOUT_SECONDS`. kombu waits without a timeout by default,
so a broker that accepts connections and never answers (a frozen redis-server, a
partition that drops packets without a reset) held beat, and any publish of the
worker's, until the kernel gave up on the connection: hours without a periodic task
sent and without a line in the log. Now a send fails in about 25 s (Celery's publish
retry policy tries four times), beat logs it, goes on with its schedule and sends
again once the broker answers (`tests/ops/test_frozen_broker.py`).

On RabbitMQ the same holds, by py-amqp's own options (`rabbitmq_transport_options`):
py-amqp bounds connecting and the handshake, then waits on an open connection without
a timeout, so a broker that froze after beat (or a worker's publish) had connected
held the send, waiting for the broker's confirm of it, for ever. Now each wait on the
socket, and each write to it, gives up after `RABBITMQ_SOCKET_TIMEOUT_SECONDS`. The
worker's consuming connection keeps Celery's AMQP heartbeat (120 s): a worker waits
out a frozen broker and goes on once it answers, and a shorter heartbeat would only
have the broker drop, and deliver again, the tasks of a worker that waited a little
long.
"""

from typing import Any

from kombu import Connection, Exchange, Queue

TASK_QUEUE = "celery"
DEAD_LETTERS = "celery.dead"


def rabbitmq_queues(*, delivery_limit: int) -> list[Queue]:
    """The task queue: quorum, topic-routed, dead-lettering past `delivery_limit`."""
    return [
        Queue(
            TASK_QUEUE,
            Exchange(TASK_QUEUE, type="topic"),
            routing_key=TASK_QUEUE,
            queue_arguments={
                "x-queue-type": "quorum",
                "x-delivery-limit": delivery_limit,
                "x-dead-letter-exchange": DEAD_LETTERS,
                # At-least-once dead lettering: the broker keeps a message until the
                # dead-letter queue has confirmed it (it needs reject-publish).
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
            },
        )
    ]


def dead_letter_queue() -> Queue:
    return Queue(
        DEAD_LETTERS,
        Exchange(DEAD_LETTERS, type="fanout"),
        queue_arguments={"x-queue-type": "quorum"},
    )


def declare_dead_letter_queue(connection: Connection) -> None:
    """Declare `celery.dead` (workers call it at start, before any dead letter)."""
    dead_letter_queue()(connection.default_channel).declare()


def dead_letters(connection: Connection, *, requeue: bool = False) -> list[dict]:
    """Describe every message in the dead-letter queue; with `requeue`, send each one
    back to the task queue (the task, being idempotent, runs or changes nothing)."""
    channel = connection.default_channel
    queue = dead_letter_queue()(channel)
    queue.declare()
    found: list[dict[str, Any]] = []
    held = []
    producer = connection.Producer(channel) if requeue else None
    while (message := queue.get(no_ack=False)) is not None:
        headers = message.headers or {}
        found.append(
            {
                "task": headers.get("task"),
                "id": headers.get("id"),
                "argsrepr": headers.get("argsrepr"),
                "deliveries": headers.get("x-delivery-count"),
            }
        )
        if producer is not None:
            # Published again with its own body and headers (minus the broker's
            # record of its deaths), then taken off the dead-letter queue.
            producer.publish(
                message.body,
                exchange=TASK_QUEUE,
                routing_key=TASK_QUEUE,
                headers={k: v for k, v in headers.items() if not k.startswith("x-")},
                content_type=message.content_type,
                content_encoding=message.content_encoding,
                delivery_mode=2,
            )
            message.ack()
        else:
            held.append(message)
    # Only looked at: back where they were, in order, once we have seen them all.
    for message in held:
        message.reject(requeue=True)
    return found


# redis-py's own default, which kombu replaces with none. kombu reads a BRPOP's
# answer only once the socket is readable, so the worker's idle polls are not cut
# short by it; it stays above their 1 s (`brpop_timeout`) all the same, with room for
# a busy broker's slow answer.
REDIS_SOCKET_TIMEOUT_SECONDS = 5.0


# How long a message a worker took stays invisible on a Redis broker before another
# worker is handed it: until the worker acknowledges it, after the task ran. Redis has
# no delayed delivery, so a task with a countdown waits unacknowledged in the worker
# that took it until it is due; the longest countdown is the provider simulator's last
# retry of a callback (2 h, PROVIDER_RETRY_SCHEDULE), then a run of at most 120 s.
# Shorter, such a task would be handed to a second worker while the first still holds
# it, and again after every timeout. What the length costs: an acknowledgement lost
# in a broker freeze brings its (already run, idempotent) task back only this late.
REDIS_VISIBILITY_TIMEOUT_SECONDS = 4 * 3600


def redis_transport_options(
    *, visibility_timeout: int, socket_timeout: float = REDIS_SOCKET_TIMEOUT_SECONDS
) -> dict[str, Any]:
    """The Redis transport's options: `visibility_timeout`, and a bound on every
    wait on the broker's socket (connect, then each command's answer)."""
    return {
        "visibility_timeout": visibility_timeout,
        "socket_connect_timeout": socket_timeout,
        "socket_timeout": socket_timeout,
    }


# Every wait on a RabbitMQ broker's socket, as on Redis: connecting and the handshake,
# each answer of the broker (a publish's confirm included) and each write.
RABBITMQ_SOCKET_TIMEOUT_SECONDS = 5.0


def rabbitmq_transport_options(
    *, socket_timeout: float = RABBITMQ_SOCKET_TIMEOUT_SECONDS
) -> dict[str, Any]:
    """py-amqp's connection options: every task the broker accepts confirmed, and a
    bound on every wait on the broker's socket (connect and handshake, each answer,
    each write)."""
    return {
        # The broker confirms every task it accepts: a lost one is an error, not
        # silence.
        "confirm_publish": True,
        "connect_timeout": socket_timeout,
        # The socket's SO_RCVTIMEO and SO_SNDTIMEO, once connected.
        "read_timeout": socket_timeout,
        "write_timeout": socket_timeout,
    }
