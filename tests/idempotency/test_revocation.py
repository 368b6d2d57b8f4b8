"""A revoked API token gets nothing more, not even replays from the Redis shortcut.

The replay middleware answers a retry from Redis before anyone authenticates it, by
way of the token's digest → scope entry that a finished request wrote. Revoking the
token must end that at once, and a request the token sent before it was revoked must
not write the entry again when it finishes.
"""

import threading
import time

import pytest
from rest_framework.authtoken.models import Token, TokenProxy

from tests.conftest import run_in_threads

pytestmark = [
    pytest.mark.urls("tests.idempotency.urls"),
    pytest.mark.usefixtures("needs_redis"),
]
DEPOSITS = "/test/deposits"


def assert_refused(response) -> None:
    assert response.status_code == 401, response.content
    assert response.json()["code"] == "authentication_failed"
    assert "Idempotent-Replayed" not in response


def finished_and_replayed(alice, key, django_assert_num_queries) -> None:
    first = alice.post(DEPOSITS, {"amount": 5}, key)
    assert first.status_code == 201
    with django_assert_num_queries(0):  # answered by the Redis shortcut
        again = alice.post(DEPOSITS, {"amount": 5}, key)
    assert again["Idempotent-Replayed"] == "true"


@pytest.mark.django_db
@pytest.mark.parametrize("model", [Token, TokenProxy])  # the admin deletes proxies
def test_a_deleted_token_is_refused_at_once(
    alice, key, django_assert_num_queries, model
):
    finished_and_replayed(alice, key, django_assert_num_queries)
    model.objects.get(key=alice.token).delete()
    assert_refused(alice.post(DEPOSITS, {"amount": 5}, key))


@pytest.mark.django_db
def test_a_rotated_token_is_refused_and_its_successor_replays(
    alice, key, django_assert_num_queries
):
    finished_and_replayed(alice, key, django_assert_num_queries)
    old = Token.objects.get(key=alice.token)
    old.delete()
    new = Token.objects.create(user=alice.user)
    assert_refused(alice.post(DEPOSITS, {"amount": 5}, key))
    alice.token = new.key
    again = alice.post(DEPOSITS, {"amount": 5}, key)
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert alice.deposits() == 1


@pytest.mark.django_db
def test_a_deactivated_user_is_refused_at_once(alice, key, django_assert_num_queries):
    finished_and_replayed(alice, key, django_assert_num_queries)
    alice.user.is_active = False
    alice.user.save()
    assert_refused(alice.post(DEPOSITS, {"amount": 5}, key))


@pytest.mark.django_db(transaction=True)
def test_a_request_in_flight_when_its_token_is_revoked_does_not_bring_it_back(
    alice, key
):
    alice.post(DEPOSITS, {"amount": 5}, f"{key}-earlier")  # Redis knows the token
    started = threading.Event()

    def work(i: int):
        if i == 0:  # authenticated, then sleeps in the view while the token goes
            started.set()
            return alice.post(DEPOSITS, {"amount": 5, "sleep": 1.5}, key)
        assert started.wait(timeout=30)
        time.sleep(0.5)
        return Token.objects.filter(key=alice.token).delete()

    slow, _ = run_in_threads(2, work)
    assert slow.status_code == 201, slow.content
    assert_refused(alice.post(DEPOSITS, {"amount": 5, "sleep": 1.5}, key))
    assert_refused(alice.post(DEPOSITS, {"amount": 5}, f"{key}-earlier"))


@pytest.mark.django_db
def test_a_known_caller_s_finish_does_not_write_its_entry_again(alice, key):
    from idempotency import fastpath
    from idempotency.redis import get_redis

    redis = get_redis()
    entry = fastpath._credential_key(fastpath.credential_digest(f"Token {alice.token}"))
    redis.delete(entry)
    assert alice.post(DEPOSITS, {"amount": 5}, f"{key}-1").status_code == 201
    assert redis.pttl(entry) > fastpath.CREDENTIAL_MS - 10_000  # learnt at the finish
    redis.pexpire(entry, 5_000)
    # Found by its credential: the finish saves the round trip's work of rewriting
    # the entry, which lives out its time from when it was written.
    assert alice.post(DEPOSITS, {"amount": 5}, f"{key}-2").status_code == 201
    assert 0 < redis.pttl(entry) <= 5_000
    redis.delete(entry)  # expired: the next request begins on its own and teaches it
    assert alice.post(DEPOSITS, {"amount": 5}, f"{key}-3").status_code == 201
    assert redis.pttl(entry) > fastpath.CREDENTIAL_MS - 10_000
