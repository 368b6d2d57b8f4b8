"""Celery on RabbitMQ as ledger/broker.py sets it up, against the real RabbitMQ on
127.0.0.1:5672, on a vhost of the test's own: a quorum queue, a countdown kept by the
broker's native delayed delivery (no worker holds it unacknowledged), and a message
that kills its worker every time moved to the dead-letter queue after the delivery
limit, shown by `manage.py dead_letters` and sent back by `--requeue`."""

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import wait_for
from tests.servers import ROOT, rabbitmq_vhost, rabbitmqctl, stop

pytestmark = pytest.mark.slow

PYTHON = str(ROOT / ".venv/bin/python")


@pytest.fixture(scope="module")
def vhost() -> Iterator[str]:
    """A vhost of this test's own on the machine's RabbitMQ (guest/guest)."""
    with rabbitmq_vhost() as url:
        yield url.rpartition("/")[2]


@pytest.fixture
def env(vhost: str, settings) -> dict[str, str]:
    db = settings.DATABASES["default"]
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.ops.rabbit_settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "CELERY_BROKER_URL": f"amqp://guest:guest@127.0.0.1:5672/{vhost}",
        "CELERY_DELIVERY_LIMIT": "2",
    }


@pytest.fixture
def worker(env: dict[str, str], tmp_path: Path) -> Iterator[subprocess.Popen]:
    log_path = tmp_path / "worker.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                str(ROOT / ".venv/bin/celery"),
                "-A",
                "ledger",
                "worker",
                "-I",
                "tests.ops.rabbit_tasks",
                "--pool=prefork",
                "--concurrency=1",
                "--without-gossip",
                "--without-mingle",
                "--loglevel=INFO",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_for(
                lambda: "ready." in log_path.read_text() or process.poll() is not None,
                60,
                "the worker's start",
            )
            assert process.poll() is None, log_path.read_text()
            process.log_path = log_path  # type: ignore[attr-defined]
            yield process
        finally:
            stop(process)


def send(env: dict[str, str], task: str, *args: str, countdown: int = 0) -> None:
    """Send a task from a process of its own, configured as the web process is."""
    script = (
        "import django, sys; django.setup(); "
        "from tests.ops import rabbit_tasks; "
        f"getattr(rabbit_tasks, {task!r}).apply_async("
        f"args=sys.argv[1:], countdown={countdown})"
    )
    subprocess.run([PYTHON, "-c", script, *args], cwd=ROOT, env=env, check=True)


def queues(vhost: str) -> dict[str, dict[str, Any]]:
    rows = rabbitmqctl(
        "list_queues",
        "-p",
        vhost,
        "name",
        "type",
        "messages_ready",
        "messages_unacknowledged",
    )
    table: dict[str, dict[str, Any]] = {}
    for line in rows.splitlines():
        parts = line.split("\t")
        if len(parts) == 4 and parts[2].isdigit():
            name, kind, ready, unacked = parts
            table[name] = {"type": kind, "ready": int(ready), "unacked": int(unacked)}
    return table


def test_a_countdown_waits_in_the_broker_not_in_a_worker(env, worker, vhost, tmp_path):
    arrival = tmp_path / "arrival"
    sent = time.time()
    send(env, "note_arrival", str(arrival), countdown=12)

    def delayed() -> bool:
        table = queues(vhost)
        assert table["celery"]["type"] == "quorum"
        # Nothing is in the worker's hands: the message waits in a delay queue.
        assert table["celery"]["unacked"] == 0
        return any(
            name.startswith("celery_delayed_") and row["ready"] == 1
            for name, row in table.items()
        )

    wait_for(delayed, 10, "the message in a delay queue")
    assert not arrival.exists()
    wait_for(arrival.exists, 60, "the delayed task's arrival")
    assert float(arrival.read_text()) - sent >= 11


def test_a_poison_message_is_dead_lettered_and_can_be_sent_back(
    env, worker, vhost, tmp_path
):
    flag, done = tmp_path / "flag", tmp_path / "done"
    flag.touch()
    send(env, "die_while_flagged", str(flag), str(done))

    # Delivered, killing its worker process each time, then moved aside.
    wait_for(
        lambda: queues(vhost).get("celery.dead", {}).get("ready") == 1,
        90,
        "the message in the dead-letter queue",
    )
    assert queues(vhost)["celery"]["ready"] == 0
    assert worker.poll() is None  # the worker itself keeps serving

    command = [PYTHON, "manage.py", "dead_letters"]
    listed = json.loads(
        subprocess.run(
            command, cwd=ROOT, env=env, check=True, capture_output=True, text=True
        ).stdout
    )
    assert listed["count"] == 1
    assert listed["messages"][0]["task"] == "tests.ops.rabbit_tasks.die_while_flagged"
    assert queues(vhost)["celery.dead"]["ready"] == 1  # looking moved nothing

    # The cause fixed, the operator sends it back and it runs once.
    flag.unlink()
    subprocess.run([*command, "--requeue"], cwd=ROOT, env=env, check=True)
    wait_for(done.exists, 60, "the requeued task's run")
    # The broker's queue statistics lag a moment behind its acknowledgements.
    wait_for(
        lambda: queues(vhost)["celery.dead"]["ready"] == 0,
        30,
        "an empty dead-letter queue",
    )


DEAD = 300  # enough for two commands started together to overlap


def dead_letter(connection, count: int) -> None:
    """`count` task messages in `celery.dead`, as the broker leaves them there (the
    task queue declared as a worker declares it)."""
    from ledger.broker import DEAD_LETTERS, dead_letter_queue, rabbitmq_queues

    channel = connection.default_channel
    for queue in rabbitmq_queues(delivery_limit=2):
        queue(channel).declare()
    dead_letter_queue()(channel).declare()
    producer = connection.Producer(channel)
    for n in range(count):
        producer.publish(
            b"[[], {}, {}]",
            exchange=DEAD_LETTERS,
            routing_key="celery",
            headers={
                "task": "tests.ops.rabbit_tasks.note_arrival",
                "id": f"task-{n}",
                "argsrepr": f"('{n}',)",
                "x-delivery-count": 2,
            },
            content_type="application/json",
            content_encoding="utf-8",
            delivery_mode=2,
        )


def drained(connection, name: str) -> list[str]:
    """Take every message off queue `name`: their task ids."""
    from kombu import Queue

    queue = Queue(name, no_declare=True)(connection.default_channel)
    ids = []
    while (message := queue.get(no_ack=True)) is not None:
        ids.append(message.headers["id"])
    return ids


def test_requeue_run_twice_at_once_sends_each_dead_letter_back_once(env, tmp_path):
    from kombu import Connection

    with Connection(env["CELERY_BROKER_URL"]) as connection:
        dead_letter(connection, DEAD)
        command = [PYTHON, "manage.py", "dead_letters", "--requeue"]
        runs = [
            subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
            )
            for _ in range(2)
        ]
        outputs = [run.communicate(timeout=60)[0] for run in runs]
        assert [run.returncode for run in runs] == [0, 0], outputs
        reports = [json.loads(out) for out in outputs]
        said = [m["id"] for report in reports for m in report["messages"]]
        # Each message went back once, by one command or the other.
        assert sorted(said) == sorted(f"task-{n}" for n in range(DEAD))
        assert sum(report["count"] for report in reports) == DEAD, [
            r["count"] for r in reports
        ]
        back = drained(connection, "celery")
        assert sorted(back) == sorted(said)
        assert drained(connection, "celery.dead") == []


@pytest.mark.parametrize(
    "args, error",
    [
        (["--requeue=yes"], "ignored explicit argument 'yes'"),
        (["--all"], "unrecognized arguments: --all"),
        (["17"], "unrecognized arguments: 17"),
    ],
)
def test_dead_letters_refuses_bad_options_and_moves_nothing(env, args, error):
    from kombu import Connection

    with Connection(env["CELERY_BROKER_URL"]) as connection:
        dead_letter(connection, 2)
        ran = subprocess.run(
            [PYTHON, "manage.py", "dead_letters", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        assert ran.returncode == 2, ran
        assert error in ran.stderr
        assert "Traceback" not in ran.stderr
        assert drained(connection, "celery") == []
        assert sorted(drained(connection, "celery.dead")) == ["task-0", "task-1"]
