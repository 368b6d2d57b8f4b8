"""A worker SIGKILLed inside the view does not leave its key stuck, and the effect
still happens exactly once. Real gunicorn, real PostgreSQL, real Redis."""

import contextlib
import os
import signal
import threading
import time

import httpx
import pytest
from django.db import connection

import tests.idempotency.views  # noqa: F401 - registers the test resumer
from idempotency.completer import complete_stuck
from idempotency.models import IdempotencyRecord
from tests.helpers import wait_for
from tests.servers import children, gunicorn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
LEASE = 2  # seconds


@pytest.fixture(scope="module")
def server(tmp_path_factory, django_db_setup, django_db_blocker):
    """One server for the module: each test has its own customer and key (and the
    database is flushed between tests); the worker a test kills is replaced by the
    master, and a request sent meanwhile waits in the listen backlog for it."""
    with gunicorn(
        tmp_path_factory.mktemp("crash"),
        "tests.idempotency.server_settings",
        IDEMPOTENCY_LEASE_SECONDS=str(LEASE),
    ) as (url, master):
        yield url, master


def send_in_background(url: str, path: str, token: str, key: str, body: dict):
    """Fire a request whose worker we are about to kill; its outcome is unknown."""

    def send() -> None:
        # The connection dies with the worker: exactly the unknown outcome.
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(
                f"{url}{path}",
                json=body,
                headers={"Authorization": f"Token {token}", "Idempotency-Key": key},
                timeout=30,
            )

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def kill_worker(master) -> None:
    (worker,) = children(master.pid)
    os.kill(worker, signal.SIGKILL)


def post(url, path, token, key, body) -> httpx.Response:
    return httpx.post(
        f"{url}{path}",
        json=body,
        headers={"Authorization": f"Token {token}", "Idempotency-Key": key},
        timeout=30,
    )


def open_transaction_elsewhere() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND state = 'idle in transaction' AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0] > 0


def retry_until_done(url, path, token, key, body) -> tuple[httpx.Response, int]:
    """Retry like a well-behaved client: honour 409 + Retry-After, stop on success."""
    busy = 0
    for _ in range(40):
        try:
            response = post(url, path, token, key, body)
        except httpx.HTTPError:  # the master is still replacing the killed worker
            time.sleep(0.2)
            continue
        if response.status_code != 409:
            return response, busy
        busy += 1
        time.sleep(min(int(response.headers["Retry-After"]), 1))
    raise AssertionError("never finished")


def test_killed_inside_a_phased_request_resumes_from_its_recovery_point(server, alice):
    url, master = server
    body = {"amount": 5, "sleep": 30}
    thread = send_in_background(url, "/test/phased-deposits", alice.token, "k1", body)
    # Phase 1 (the deposit) has committed; the worker now waits on the "outside call".
    wait_for(
        lambda: IdempotencyRecord.objects.filter(
            key="k1", recovery_point="deposited"
        ).exists()
    )
    kill_worker(master)
    thread.join(timeout=30)
    assert alice.deposits() == 1
    record = IdempotencyRecord.objects.get(key="k1")
    assert record.status == "processing"  # the key is held by a dead process...

    # ...until its lease passes (a retry before then is 409); then a retry takes it
    # over. (How many 409s came first depends on how busy the machine is.)
    response, _ = retry_until_done(
        url, "/test/phased-deposits", alice.token, "k1", body
    )
    assert response.status_code == 201
    assert "Idempotent-Replayed" not in response.headers
    record.refresh_from_db()
    assert (record.status, record.recovery_point) == ("succeeded", "finished")
    assert record.recovery_data["resumed"] is True
    assert alice.deposits() == 1  # resumed after the deposit: never twice
    again = post(url, "/test/phased-deposits", alice.token, "k1", body)
    assert again.content == response.content
    assert again.headers["Idempotent-Replayed"] == "true"


def test_killed_inside_an_atomic_request_leaves_nothing_and_reruns_once(server, alice):
    url, master = server
    body = {"amount": 5, "sleep": 3}
    thread = send_in_background(url, "/test/deposits", alice.token, "k2", body)
    # Wait until the request's transaction has done its work and not yet committed.
    wait_for(open_transaction_elsewhere)
    kill_worker(master)
    thread.join(timeout=30)
    # The killed transaction rolled back: no money moved, no record left behind.
    assert alice.deposits() == 0
    assert not IdempotencyRecord.objects.filter(key="k2").exists()
    response, _ = retry_until_done(url, "/test/deposits", alice.token, "k2", body)
    assert response.status_code == 201
    assert alice.deposits() == 1


def test_a_request_whose_client_never_returns_is_completed_by_beat(server, alice):
    url, master = server
    body = {"amount": 5, "sleep": 30}
    thread = send_in_background(url, "/test/phased-deposits", alice.token, "k3", body)
    wait_for(
        lambda: IdempotencyRecord.objects.filter(
            key="k3", recovery_point="deposited"
        ).exists()
    )
    kill_worker(master)  # the agent dies too: nobody will retry
    thread.join(timeout=30)
    record = IdempotencyRecord.objects.get(key="k3")
    assert record.status == "processing"
    assert complete_stuck() == 0  # its lease has not passed yet
    time.sleep(LEASE + 0.5)
    assert complete_stuck() == 1  # beat's task, once the lease passed
    assert complete_stuck() == 0  # and only once
    record.refresh_from_db()
    assert (record.status, record.recovery_point) == ("succeeded", "finished")
    assert record.recovery_data["resumed"] is True
    assert alice.deposits() == 1
    # The client, back at last, gets what the completer stored.
    again = post(url, "/test/phased-deposits", alice.token, "k3", body)
    assert again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["entry_id"] == record.recovery_data["entry_id"]
    assert alice.deposits() == 1
