"""Races between real threads on PostgreSQL: the body takes effect exactly once."""

import pytest

from idempotency.models import IdempotencyRecord
from tests.conftest import run_in_threads

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("tests.idempotency.urls"),
]


@pytest.fixture(params=["redis", "database only"])
def path_kind(request, settings):
    if request.param == "database only":
        settings.REDIS_URL = ""
    return request.param


def test_50_threads_one_key_execute_once(alice, key, path_kind):
    # The body sleeps a little so the duplicates really arrive while it is in flight.
    body = {"amount": 5, "sleep": 0.2}
    responses = run_in_threads(50, lambda _: alice.post("/test/deposits", body, key))
    statuses = [r.status_code for r in responses]
    assert alice.deposits() == 1
    created = [r for r in responses if r.status_code == 201]
    first = [r for r in created if "Idempotent-Replayed" not in r]
    assert len(first) == 1, statuses
    assert all(r.content == first[0].content for r in created)
    assert set(statuses) <= {201, 409}, statuses
    for busy in (r for r in responses if r.status_code == 409):
        assert busy.json()["code"] == "idempotency_key_in_flight"
        assert int(busy["Retry-After"]) >= 1
    # Everyone who was told "in flight" now gets the original answer.
    assert alice.post("/test/deposits", body, key).content == first[0].content
    assert alice.deposits() == 1


def test_50_threads_50_keys_execute_50_times(alice, path_kind):
    responses = run_in_threads(
        50, lambda i: alice.post("/test/deposits", {"amount": 5}, f"k-{i}")
    )
    assert [r.status_code for r in responses] == [201] * 50
    assert alice.deposits() == 50
    assert IdempotencyRecord.objects.filter(status="succeeded").count() == 50


def test_phased_race_executes_once(alice, key, path_kind):
    body = {"amount": 5, "sleep": 0.2}
    responses = run_in_threads(
        16, lambda _: alice.post("/test/phased-deposits", body, key)
    )
    assert {r.status_code for r in responses} <= {201, 409}
    assert alice.deposits() == 1
    final = alice.post("/test/phased-deposits", body, key)
    assert final.status_code == 201 and final["Idempotent-Replayed"] == "true"


def test_a_duplicate_while_the_first_runs_is_409_at_once(alice, key, path_kind):
    """Also on SQLite, whose `BEGIN IMMEDIATE` would make the duplicate wait for the
    first request and then replay it (`idempotency.keylocks`)."""
    import threading
    import time

    first = threading.Thread(
        target=lambda: alice.post("/test/deposits", {"amount": 5, "sleep": 1.5}, key)
    )
    first.start()
    try:
        time.sleep(0.5)  # the first is in its transaction by now
        started = time.monotonic()
        busy = alice.post("/test/deposits", {"amount": 5, "sleep": 1.5}, key)
        assert busy.status_code == 409, busy.content
        assert busy.json()["code"] == "idempotency_key_in_flight"
        assert time.monotonic() - started < 0.5
        # `Prefer: wait` waits for it and replays it
        waited = alice.client().post(
            "/test/deposits",
            {"amount": 5, "sleep": 1.5},
            format="json",
            headers={"Idempotency-Key": key, "Prefer": "wait=5"},
        )
        assert waited.status_code == 201 and waited["Idempotent-Replayed"] == "true"
    finally:
        first.join(timeout=30)
    assert alice.deposits() == 1
