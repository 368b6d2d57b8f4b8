"""The engine on a real Redis Cluster: three primaries, three replicas, on loopback.

Every script keeps its keys in one hash slot (a cluster would refuse it with CROSSSLOT,
and the engine would quietly fall back to the database: so the tests whose requests run
one at a time check that nothing fell back, and pin the round trips). What a cluster
cannot do in one script costs a second round trip: the replay middleware reads the
caller's scope, then begins; a finish remembers the caller's credential on its own.
Then a primary is SIGKILLed while requests run: its replica takes over, and no key
runs twice.

The cluster starts once for the module (about two seconds) and is stopped, every
process of it, when the module ends.
"""

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings as django_settings
from prometheus_client import REGISTRY
from rest_framework.authtoken.models import Token

import idempotency.metrics  # noqa: F401  (registers the counters before we read them)
from idempotency import fastpath
from idempotency.fastpath import (
    REVOKED,
    _credential_key,
    _names,
    credential_digest,
)
from idempotency.redis import Cluster, get_redis
from tests.conftest import Background, run_in_threads
from tests.helpers import assert_problem, key_taken
from tests.redis_cluster import OwnCluster
from tests.servers import free_port

pytestmark = [pytest.mark.urls("tests.idempotency.urls"), pytest.mark.slow]
DEPOSITS = "/test/deposits"


def fallbacks() -> float:
    sample = {"outcome": "fallback"}
    return REGISTRY.get_sample_value("idempotency_requests_total", sample) or 0.0


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory) -> Iterator[OwnCluster]:
    if not django_settings.REDIS_URL:  # skip before starting anything
        pytest.skip("needs Redis (the embedded SQLite mode runs without it)")
    cluster = OwnCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def on_cluster(needs_redis, redis_cluster, settings) -> OwnCluster:
    """The app on the cluster, emptied."""
    settings.REDIS_URL, settings.REDIS_CLUSTER = redis_cluster.url, True
    redis_cluster.flush()
    return redis_cluster


@pytest.fixture
def no_fallback(on_cluster) -> Iterator[None]:
    """The test's requests all went through the cluster: none fell back (as every
    one would if a script's keys were in two slots)."""
    before = fallbacks()
    yield
    assert fallbacks() == before, "a request fell back to the database"


def cluster() -> Cluster:
    client = get_redis()
    assert isinstance(client, Cluster)
    return client


def round_trips(monkeypatch) -> list[str]:
    """Record every command this process sends to the cluster (they still run)."""
    sent: list[str] = []
    client = cluster()
    send = client.execute_command

    def counting(*args, **options):
        sent.append(str(args[0]))
        return send(*args, **options)

    monkeypatch.setattr(client, "execute_command", counting)
    return sent


def scope_of(customer) -> str:
    return f"user:{customer.user.pk}"


def credential_of(customer) -> bytes:
    return _credential_key(credential_digest(f"Token {customer.token}")).encode()


def in_redis(name: str | bytes) -> Any:
    return cluster().get(name)


def wait_for_lock(customer, key: str) -> None:
    lock, _, _ = _names(scope_of(customer), key)
    deadline = time.monotonic() + 20
    while not cluster().exists(lock):
        assert time.monotonic() < deadline, "the first request never took the lock"
        time.sleep(0.02)


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.django_db
def test_first_execution_and_replays_on_the_cluster(
    alice, key, on_cluster, monkeypatch, django_assert_num_queries
):
    alice.post(DEPOSITS, {"amount": 5}, f"{key}-earlier")  # scripts loaded
    cluster().delete(credential_of(alice))  # alice is new to Redis again
    sent = round_trips(monkeypatch)
    first = alice.post(DEPOSITS, {"amount": 5}, key)
    assert first.status_code == 201
    # The middleware's scope lookup finds nothing; the engine begins; the finish,
    # then the credential (another slot) in a round trip of its own.
    assert sent == ["GET", "EVALSHA", "EVALSHA", "EVALSHA"]
    lock, response, _ = _names(scope_of(alice), key)
    assert not cluster().exists(lock) and in_redis(response)
    assert in_redis(credential_of(alice)) == scope_of(alice).encode()

    sent.clear()
    with django_assert_num_queries(0):  # the middleware answers: not even the token
        again = alice.post(DEPOSITS, {"amount": 5}, key)
    assert sent == ["GET", "EVALSHA"]  # the scope, then the cached response
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.content == first.content and again["Location"] == first["Location"]

    sent.clear()  # a known caller's first execution: the middleware took the lock,
    assert alice.post(DEPOSITS, {"amount": 5}, f"{key}-2").status_code == 201
    assert sent == ["GET", "EVALSHA", "EVALSHA"]  # and the finish leaves its entry be
    assert alice.deposits() == 3


@pytest.mark.django_db
def test_readyz_pings_the_cluster(client, on_cluster):
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["redis"] == "ok"


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.django_db
def test_the_shortcut_answers_no_other_token_or_request(alice, bob, key, on_cluster):
    alice.post(DEPOSITS, {"amount": 5}, key)
    assert "Idempotent-Replayed" not in bob.post(DEPOSITS, {"amount": 5}, key)
    stranger = alice.client()
    stranger.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    refused = alice.post(DEPOSITS, {"amount": 5}, key, stranger)
    assert_problem(refused, 401, "authentication_failed")
    reused = alice.post(DEPOSITS, {"amount": 6}, key)
    assert_problem(reused, 422, "idempotency_key_reused")
    assert alice.deposits() == 1 and bob.deposits() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("on_postgres", "no_fallback")
def test_in_flight_then_prefer_wait_on_the_cluster(alice, key, on_cluster, monkeypatch):
    woken: list[bool] = []  # what Redis's wait answered: True if it did the waiting
    wait = fastpath.wait_for_finish
    monkeypatch.setattr(
        fastpath, "wait_for_finish", lambda *a: woken.append(wait(*a)) or woken[-1]
    )
    body = {"amount": 5, "sleep": 1.5}
    first = Background(lambda: alice.post(DEPOSITS, body, key))
    first.start()
    wait_for_lock(alice, key)
    began = time.monotonic()
    busy = alice.post(DEPOSITS, body, key)
    assert_problem(busy, 409, "idempotency_key_in_flight")
    waiting = alice.client()
    waiting.credentials(HTTP_AUTHORIZATION=f"Token {alice.token}", HTTP_PREFER="wait=8")
    waited = alice.post(DEPOSITS, body, key, waiting)
    assert time.monotonic() - began < 6  # woken by the finish, not at the deadline
    answer = first.outcome()
    assert answer.status_code == 201, answer.content
    assert waited.status_code == 201 and waited["Preference-Applied"] == "wait=8"
    assert waited.content == answer.content and waited["Idempotent-Replayed"] == "true"
    assert woken == [True]  # woken by the finish's PUBLISH, relayed by the cluster
    assert alice.deposits() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("on_postgres")
def test_a_token_revoked_in_flight_stays_revoked_on_the_cluster(alice, key, on_cluster):
    assert alice.post(DEPOSITS, {"amount": 5}, f"{key}-earlier").status_code == 201
    assert in_redis(credential_of(alice)) == scope_of(alice).encode()

    def work(i: int):
        if i == 0:  # authenticated, then sleeps in the view while the token goes
            return alice.post(DEPOSITS, {"amount": 5, "sleep": 1.5}, key)
        key_taken(key)  # (its Redis lock comes before authentication)
        return Token.objects.filter(key=alice.token).delete()

    slow, _ = run_in_threads(2, work)
    assert slow.status_code == 201, slow.content
    # Its finish did not write the credential back over the revoked mark.
    assert in_redis(credential_of(alice)) == REVOKED.encode()
    for again in (key, f"{key}-earlier"):  # not even a replay
        refused = alice.post(DEPOSITS, {"amount": 5}, again)
        assert_problem(refused, 401, "authentication_failed")
        assert "Idempotent-Replayed" not in refused


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("on_postgres")
def test_thirty_threads_on_one_key_execute_once_on_the_cluster(alice, key, on_cluster):
    alice.post(DEPOSITS, {"amount": 1}, f"{key}-earlier")  # the middleware knows her
    body = {"amount": 7, "sleep": 0.2}
    results = run_in_threads(30, lambda i: alice.post(DEPOSITS, body, key))
    statuses = [getattr(r, "status_code", r) for r in results]
    assert set(statuses) <= {201, 409}, statuses
    created = [r for r in results if r.status_code == 201]
    assert created and len({r.content for r in created}) == 1
    assert alice.deposits() == 2  # the earlier one, and this key's once
    assert alice.post(DEPOSITS, body, key)["Idempotent-Replayed"] == "true"


@pytest.mark.django_db
def test_an_unreachable_cluster_falls_back_or_refuses(alice, key, settings):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    settings.REDIS_CLUSTER = True
    before = fallbacks()
    first = alice.post(DEPOSITS, {"amount": 5}, key)
    again = alice.post(DEPOSITS, {"amount": 5}, key)
    assert first.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert alice.deposits() == 1 and fallbacks() == before + 2
    settings.IDEMPOTENCY_REDIS_FAILURE = "refuse"
    refused = alice.post(DEPOSITS, {"amount": 5}, f"{key}-2")
    assert_problem(refused, 503, "idempotency_unavailable")
    assert alice.deposits() == 1


KEYS, LEASE = 10, 3


def retried_while_in_flight(customer, key: str, seconds: float):
    deadline = time.monotonic() + seconds
    while True:
        response = customer.post(DEPOSITS, {"amount": 1, "sleep": 0.01}, key)
        if response.status_code != 409 or time.monotonic() > deadline:
            return response
        time.sleep(0.2)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("on_postgres", "needs_redis")
def test_a_primary_killed_mid_run_executes_each_key_once(
    alice, redis_cluster, settings
):
    settings.REDIS_URL, settings.REDIS_CLUSTER = redis_cluster.url, True
    settings.IDEMPOTENCY_LEASE_SECONDS = LEASE
    redis_cluster.flush()
    alice.post(DEPOSITS, {"amount": 1}, "earlier")  # the middleware knows her
    # The primary that serves the most of the run's keys dies.
    locks = [_names(scope_of(alice), f"key-{n}")[0] for n in range(KEYS)]
    owners = [redis_cluster.primary_for(lock) for lock in locks]
    victim = max(set(owners), key=owners.count)
    before = fallbacks()
    sent = threading.Semaphore(0)
    done = threading.Event()

    def work(i: int) -> list[int]:
        statuses, n = [], 0
        while n < 30 or not done.is_set():
            body = {"amount": 1, "sleep": 0.01}
            key = f"key-{(i + n) % KEYS}"
            statuses.append(alice.post(DEPOSITS, body, key).status_code)
            sent.release()
            n += 1
        return statuses

    def requests_sent(count: int) -> None:
        for _ in range(count):
            assert sent.acquire(timeout=30), "the requests stopped"

    def killer() -> None:
        try:
            requests_sent(40)
            redis_cluster.kill(victim)  # requests are in flight on every thread
            redis_cluster.wait_for_new_primary(locks[owners.index(victim)], victim)
            requests_sent(40)  # and keep coming after the promotion
            killed.set()
        finally:
            done.set()

    killed = threading.Event()
    assassin = threading.Thread(target=killer, daemon=True)
    assassin.start()
    try:
        results = run_in_threads(8, work)
    finally:
        done.set()
        assassin.join(timeout=60)
    try:
        assert all(isinstance(r, list) for r in results), results
        assert killed.is_set(), "the primary was not killed mid-run"
        statuses = [s for r in results for s in r]
        assert set(statuses) <= {201, 409}, statuses  # never a 5xx
        assert fallbacks() > before  # the outage was felt, and fallen back from
        assert alice.deposits() == KEYS + 1  # one effect per key, across the failover
        # Every key replays. One whose finish was lost in the failover (its lock
        # was copied to the replica, its release was not) answers 409 until the
        # lock's lease ends, as after any lost finish: in flight, not known done.
        for n in range(KEYS):
            replay = retried_while_in_flight(alice, f"key-{n}", LEASE + 5)
            assert replay.status_code == 201, replay.content
            assert replay["Idempotent-Replayed"] == "true"
        # The fast path works again, on the promoted replica.
        after = fallbacks()
        fresh = alice.post(DEPOSITS, {"amount": 1}, "after-the-failover")
        assert fresh.status_code == 201 and fallbacks() == after
        _, response, _ = _names(scope_of(alice), "after-the-failover")
        assert in_redis(response)
    finally:  # the old primary comes back as a replica: the cluster is whole again
        redis_cluster.start_node(victim)
        redis_cluster.wait_until_whole()
