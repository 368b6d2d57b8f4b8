"""`Prefer: wait=N`: a duplicate waits for the first request and gets its answer.

Real threads on the real database: A runs slowly with key K; B sends the same request
with K and `Prefer: wait=N`. Instead of 409, B gets A's stored answer, replayed, once A
finishes; with Redis it is woken by A's finish (a notification), without Redis it
waits on the database. Still in flight at the deadline: the 409 after all.
"""

import threading
import time

import psycopg
import pytest
from django.db import connection

from idempotency import records
from idempotency.fastpath import _names
from idempotency.redis import get_redis
from idempotency.waiting import preferred_wait
from tests.conftest import Background
from tests.helpers import key_taken

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("tests.idempotency.urls"),
    pytest.mark.usefixtures("on_postgres"),
]


def post(customer, path, body, key, prefer=None):
    client = customer.client()
    if prefer:
        client.credentials(
            HTTP_AUTHORIZATION=f"Token {customer.token}", HTTP_PREFER=prefer
        )
    return customer.post(path, body, key, client=client)


@pytest.fixture(params=["redis", "database"])
def store(request, settings):
    if request.param == "redis" and not settings.REDIS_URL:
        pytest.skip("needs Redis (the embedded SQLite mode runs without it)")
    if request.param == "database":
        settings.REDIS_URL = ""
    return request.param


@pytest.mark.parametrize("path", ["/test/deposits", "/test/phased-deposits"])
def test_a_duplicate_waits_and_gets_the_first_answer(store, alice, key, path):
    body = {"amount": 5, "sleep": 1.5}
    first = Background(lambda: post(alice, path, body, key))
    first.start()
    key_taken(key)
    began = time.monotonic()
    second = post(alice, path, body, key, prefer="wait=8")
    waited = time.monotonic() - began
    a = first.outcome()
    assert a.status_code == 201, a.content
    assert second.status_code == 201, second.content
    assert second.content == a.content
    assert second["Idempotent-Replayed"] == "true"
    assert second["Preference-Applied"] == "wait=8"
    assert waited < 6, waited  # woken when A finished, not at the deadline
    assert alice.deposits() == 1


def test_a_waiter_behind_a_request_that_failed_takes_it_over_at_once(store, alice, key):
    """A fails after its first phase committed and releases the key: B, waiting,
    resumes it as soon as A let go (not at its deadline), and the deposit that
    committed is not made again."""
    path, body = "/test/phased-deposits", {"amount": 5, "sleep": 1, "fail": "crash"}
    # (Answers, not exceptions: a test client re-raises any thread's 500.)
    failing, waiting = alice.client(), alice.client()
    failing.raise_request_exception = waiting.raise_request_exception = False
    waiting.credentials(HTTP_AUTHORIZATION=f"Token {alice.token}", HTTP_PREFER="wait=8")
    first = Background(lambda: alice.post(path, body, key, client=failing))
    first.start()
    key_taken(key)
    began = time.monotonic()
    second = alice.post(path, body, key, client=waiting)
    waited = time.monotonic() - began
    assert first.outcome().status_code == 500
    assert second.status_code == 201, second.content
    assert second["Preference-Applied"] == "wait=8"
    assert waited < 6, waited  # when A let go, not at the deadline
    assert alice.deposits() == 1


def test_still_in_flight_at_the_deadline_is_409(store, alice, key, release):
    body = {"amount": 5, "sleep": 60}  # until released
    first = Background(lambda: post(alice, "/test/deposits", body, key))
    first.start()
    key_taken(key)
    began = time.monotonic()
    second = post(alice, "/test/deposits", body, key, prefer="wait=1")
    assert time.monotonic() - began >= 0.9
    assert second.status_code == 409
    assert second.json()["code"] == "idempotency_key_in_flight"
    # It did wait, and says so; the poll hint stays.
    assert second["Preference-Applied"] == "wait=1"
    assert second["Retry-After"] == "1"
    release()
    assert first.outcome().status_code == 201
    assert alice.deposits() == 1


def test_without_a_preference_a_duplicate_is_409_at_once(store, alice, key, release):
    body = {"amount": 5, "sleep": 60}  # until released
    first = Background(lambda: post(alice, "/test/deposits", body, key))
    first.start()
    key_taken(key)
    for prefer in (None, "wait=0", "wait=abc", "wait=-3", "respond-async"):
        began = time.monotonic()
        answer = post(alice, "/test/deposits", body, key, prefer=prefer)
        assert answer.status_code == 409, (prefer, answer.content)
        assert time.monotonic() - began < 2  # not waited (a busy machine is slow)
        assert "Preference-Applied" not in answer
    release()
    assert first.outcome().status_code == 201
    assert alice.deposits() == 1


def test_a_different_request_under_a_waited_key_is_still_422(store, alice, key):
    first = Background(
        lambda: post(alice, "/test/deposits", {"amount": 5, "sleep": 1}, key)
    )
    first.start()
    key_taken(key)
    other = post(alice, "/test/deposits", {"amount": 6}, key, prefer="wait=5")
    assert other.status_code == 422
    assert first.outcome().status_code == 201
    assert alice.deposits() == 1


def test_waiters_behind_a_lost_redis_lock_wait_out_their_own_deadline(
    needs_redis, settings, monkeypatch, alice, key
):
    """A (phased) runs; its Redis lock is lost; two waiters come at once. One of
    them takes the free Redis lock, finds A's record in flight and lets the lock go,
    which announces a finish on the key's channel: the other, woken, must look at
    the database and keep waiting, not answer 409 at once. Each waits until A
    finishes or its own deadline: the 10-second one gets A's answer, replayed; the
    2-second one the 409 at its deadline. A runs once."""
    settings.IDEMPOTENCY_LEASE_SECONDS = 30  # A's lease outlives the test
    path = "/test/phased-deposits"
    body = {"amount": 5, "sleep": 4}
    first = Background(lambda: post(alice, path, body, key))
    began = time.monotonic()
    first.start()
    key_taken(key)
    # A moment of database work between a waiter's Redis lock and its claim (a busy
    # server), so that the other waiter is subscribed by the time the lock goes.
    claim = records.claim

    def slow_claim(call):
        time.sleep(0.3)
        return claim(call)

    monkeypatch.setattr(records, "claim", slow_claim)
    time.sleep(max(0, began + 0.7 - time.monotonic()))
    lock, _, _ = _names(f"user:{alice.user.pk}", key)
    assert get_redis().delete(lock) == 1  # lost, or expired
    together = threading.Barrier(2)
    answers: dict[int, tuple[float, object]] = {}

    def waiter(seconds: int):
        together.wait(timeout=10)
        start = time.monotonic()
        answer = post(alice, path, body, key, prefer=f"wait={seconds}")
        answers[seconds] = (time.monotonic() - start, answer)
        return answer

    short, long = Background(lambda: waiter(2)), Background(lambda: waiter(10))
    short.start()
    long.start()
    a = first.outcome()
    short.outcome(), long.outcome()
    assert a.status_code == 201, a.content
    waited, answer = answers[2]
    assert answer.status_code == 409, (waited, answer.content)
    assert answer.json()["code"] == "idempotency_key_in_flight"
    assert answer["Preference-Applied"] == "wait=2"
    assert waited >= 1.9, waited  # its whole deadline, though it was woken before
    waited, answer = answers[10]
    assert answer.status_code == 201, (waited, answer.content)
    assert answer["Idempotent-Replayed"] == "true"
    assert answer["Preference-Applied"] == "wait=10"
    assert answer.content == a.content
    assert waited < 8, waited  # woken when A finished (~3.5 s), not at its deadline
    assert alice.deposits() == 1


@pytest.mark.parametrize("seconds", [0.0004, 0.002])
def test_a_wait_on_the_lock_ends_by_its_deadline_however_little_is_left(
    alice, key, seconds
):
    """A waiter that reaches the key's advisory lock with under a millisecond left
    (woken just before its deadline) still stops there: a lock_timeout rounded
    down to 0 ms is none at all to PostgreSQL, and it waited for as long as the
    request holding the key ran."""
    call = records.Call(
        scope=f"user:{alice.user.pk}",
        key=key,
        endpoint="test",
        method="POST",
        path="/test/deposits",
        fingerprint="",
        fields={},
    )
    db = connection.settings_dict
    with psycopg.connect(
        dbname=db["NAME"], user=db["USER"], host=db["HOST"], port=db["PORT"]
    ) as holder:  # a request with the key, in its transaction
        holder.execute("SELECT pg_advisory_xact_lock(%s)", [records._lock_id(call)])
        waiter = Background(
            lambda: (
                time.monotonic(),
                records.wait_for_lock(call, seconds),
                time.monotonic(),
            )
        )
        waiter.start()
        waiter.join(timeout=3)  # the holder runs on, for 3 s unless the waiter ends
        holder.rollback()
    began, _, ended = waiter.outcome()
    assert ended - began < 1, ended - began


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("wait=3", 3),
        ("respond-async, wait=10", 10),
        ("wait=600", 10),
        ('wait="4"', 4),
        # RFC 7240: a preference may carry parameters after `;`, not part of N.
        ("wait=5; foo=bar", 5),
        ("respond-async; x=1, wait=6;y", 6),
        ("wait=0", 0),
        ("wait=1.5", 0),
        ("wait=\u00b2", 0),  # a digit to str.isdigit, not to int(): once a 500
        # More digits than int() reads (4,300): once a 500.
        ("wait=" + "9" * 5000, 10),
        ("wait=" + "0" * 5000 + "7", 7),
        ("wait=" + "0" * 5000, 0),
        ("wait=", 0),
        ("handling=lenient", 0),
        (None, 0),
    ],
)
def test_the_preference_is_read_as_the_contract_says(header, seconds):
    assert preferred_wait(header) == seconds


def test_a_waiter_counts_one_outcome_what_it_answered(store, alice, key):
    """`in_flight` counts the 409s answered: a waiter that got the first answer
    counts one replay and no 409; one still in flight at its deadline, one 409
    however often it looked."""
    from tests.idempotency.test_engine import counted

    body = {"amount": 5, "sleep": 2}
    first = Background(lambda: post(alice, "/test/deposits", body, key))
    first.start()
    key_taken(key)
    in_flight, replayed = counted("in_flight"), counted("replayed")
    late = post(alice, "/test/deposits", body, key, prefer="wait=1")
    assert late.status_code == 409
    assert counted("in_flight") == in_flight + 1
    waited = post(alice, "/test/deposits", body, key, prefer="wait=8")
    assert waited.status_code == 201 and waited["Idempotent-Replayed"] == "true"
    assert first.outcome().status_code == 201
    assert counted("in_flight") == in_flight + 1
    assert counted("replayed") == replayed + 1
