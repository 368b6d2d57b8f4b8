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
