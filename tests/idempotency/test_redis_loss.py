"""Redis dies in the middle of a run: still exactly once, with the fallback counted."""

import threading

import pytest
from prometheus_client import REGISTRY

from tests.conftest import run_in_threads
from tests.servers import redis_server, stop

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("tests.idempotency.urls"),
    pytest.mark.slow,
]
KEYS = 10


def fallbacks() -> float:
    sample = {"outcome": "fallback"}
    return REGISTRY.get_sample_value("idempotency_requests_total", sample) or 0.0


def test_redis_stopped_mid_run_keeps_exactly_once(alice, settings):
    with redis_server() as (url, process):
        settings.REDIS_URL = url
        before = fallbacks()
        sent = threading.Semaphore(0)

        def work(i: int) -> list[int]:
            statuses = []
            for n in range(30):
                key = f"key-{(i + n) % KEYS}"
                body = {"amount": 1, "sleep": 0.01}
                statuses.append(alice.post("/test/deposits", body, key).status_code)
                sent.release()
            return statuses

        def killer() -> None:
            for _ in range(60):  # a quarter of the run goes through Redis
                sent.acquire()
            stop(process)

        assassin = threading.Thread(target=killer)
        assassin.start()
        results = run_in_threads(8, work)
        assassin.join(timeout=30)
        assert process.poll() is not None, "redis was not stopped mid-run"

    statuses = [s for r in results for s in r]
    assert set(statuses) <= {201, 409}, statuses  # never a 5xx
    assert alice.deposits() == KEYS  # one effect per key, across the outage
    assert fallbacks() > before
    for n in range(KEYS):  # Redis is gone: the database replays
        replay = alice.post("/test/deposits", {"amount": 1, "sleep": 0.01}, f"key-{n}")
        assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"
