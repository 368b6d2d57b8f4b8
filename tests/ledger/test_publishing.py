"""What a web process's publish asks of Celery (`ledger.publishing`).

A deployment may set a result backend (the benchmark's servers do, to wait for the
purge). A publish that asked for its result would then subscribe the web process to
the task's result channel, one more for every task it ever sent.
"""

import json
import os
import subprocess
import sys

import redis

from ledger.publishing import publish_within
from payments.services import DISPATCH_SHIPMENT
from tests.servers import ROOT
from tests.workers import BROKER_URL, broker

SENDS = 50
PUBLISH = f"""
import json
import django

django.setup()
from celery import current_app
from ledger.publishing import publish_within
from payments.services import DISPATCH_SHIPMENT

sent = [publish_within(DISPATCH_SHIPMENT, (n,)) for n in range({SENDS})]
backend = current_app.backend
consumer = getattr(backend, "result_consumer", None)
print(json.dumps({{
    "backend": type(backend).__name__,
    "sent": sum(sent),
    "subscribed": sorted(getattr(consumer, "subscribed_to", ())),
}}))
"""


def test_a_publish_asks_for_no_result_where_a_result_backend_is_set():
    broker = redis.Redis.from_url(BROKER_URL)
    broker.flushdb()
    try:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "bench.settings",  # a Redis result backend
            "CELERY_BROKER_URL": BROKER_URL,
        }
        done = subprocess.run(
            [sys.executable, "-c", PUBLISH],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        published = json.loads(done.stdout.splitlines()[-1])
        assert published["backend"] == "RedisBackend"
        assert published["sent"] == SENDS
        assert published["subscribed"] == []
        # And the worker is told not to store one either.
        queued = [
            json.loads(message)
            for key in broker.scan_iter()
            if broker.type(key) == b"list"
            for message in broker.lrange(key, 0, -1)
        ]
        assert len(queued) == SENDS
        assert {m["headers"]["ignore_result"] for m in queued} == {True}
    finally:
        broker.flushdb()


def broker_clients(db: int) -> int:
    """Connections open to the broker's Redis database."""
    clients = redis.Redis.from_url(BROKER_URL).client_list()
    return sum(1 for client in clients if int(client["db"]) == db)


def test_publishes_reuse_the_processs_connections():
    db = redis.Redis.from_url(BROKER_URL).connection_pool.connection_kwargs["db"]
    held = []  # what a request allocates between two publishes
    with broker():
        assert publish_within(DISPATCH_SHIPMENT, (0,))
        opened = broker_clients(db)
        for n in range(1, 40):
            held.append([object() for _ in range(50)])
            assert publish_within(DISPATCH_SHIPMENT, (n,))
        assert broker_clients(db) <= opened + 1
        assert redis.Redis.from_url(BROKER_URL).llen("celery") == 40
