"""Every status-code path of the contract's "Idempotent writes" section."""

import re

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone
from prometheus_client import REGISTRY

import idempotency.metrics  # noqa: F401  (registers the counters before we read them)
from idempotency import fastpath, records
from idempotency.models import IdempotencyRecord
from idempotency.redis import get_redis
from idempotency.services import record_purge_expired
from tests.helpers import assert_problem

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.idempotency.urls")]
DEPOSITS = "/test/deposits"


def counted(outcome: str) -> float:
    sample = {"outcome": outcome}
    return REGISTRY.get_sample_value("idempotency_requests_total", sample) or 0.0


@pytest.fixture(params=["redis", "database only"])
def both_paths(request, settings):
    """Run a test with the Redis fast path and without it."""
    if request.param == "database only":
        settings.REDIS_URL = ""
    return request.param


def test_missing_key_is_refused_and_nothing_runs(alice):
    before = counted("missing")
    response = alice.post(DEPOSITS, {"amount": 5}, key=None)
    assert_problem(response, 400, "idempotency_key_missing")
    assert alice.deposits() == 0
    assert counted("missing") == before + 1


@pytest.mark.parametrize("bad", ["", "x" * 256, "ключ", "tab\there", "nl\x7f"])
def test_malformed_key_is_refused(alice, bad):
    response = alice.post(DEPOSITS, {"amount": 5}, key=bad)
    assert_problem(response, 400, "idempotency_key_invalid")
    assert alice.deposits() == 0


@pytest.mark.parametrize("good", ["a", "x" * 255, '~!@#$%^&*()_+ {}|:"<>?'])
def test_any_printable_ascii_key_up_to_255_is_accepted(alice, good):
    assert alice.post(DEPOSITS, {"amount": 5}, key=good).status_code == 201


SECURITY_HEADERS = (
    "X-Content-Type-Options",
    "Referrer-Policy",
    "Cross-Origin-Opener-Policy",
    "X-Frame-Options",
)


def test_retry_replays_the_first_response_byte_for_byte(alice, key, both_paths):
    first = alice.post(DEPOSITS, {"amount": 5}, key)
    assert first.status_code == 201
    assert "Idempotent-Replayed" not in first
    for _ in range(3):
        again = alice.post(DEPOSITS, {"amount": 5}, key)
        assert again.status_code == 201
        assert again.content == first.content
        assert again["Location"] == first["Location"]
        assert again["Content-Type"] == first["Content-Type"]
        # (A replay from Redis had none: gunicorn sent it chunked.)
        assert again["Content-Length"] == first["Content-Length"]
        for security in SECURITY_HEADERS:  # (a replay from Redis had none)
            assert again[security] == first[security], security
        assert again["Content-Language"] == first["Content-Language"]
        assert again["Idempotent-Replayed"] == "true"
    assert alice.deposits() == 1
    record = IdempotencyRecord.objects.get(key=key)
    assert (record.status, record.response_status) == ("succeeded", 201)


def test_a_replay_says_the_language_its_body_was_written_in(alice, key, both_paths):
    """The stored body is the first request's, in its language: a retry asking
    for another is told so (a replay from Redis, answered before LocaleMiddleware,
    said no language; one from the database said the retry's)."""
    chinese, english = alice.client(), alice.client()
    chinese.defaults["HTTP_ACCEPT_LANGUAGE"] = "zh-hans"
    english.defaults["HTTP_ACCEPT_LANGUAGE"] = "en"
    first = alice.post(DEPOSITS, {"amount": 5}, key, client=chinese)
    assert first["Content-Language"] == "zh-hans"
    again = alice.post(DEPOSITS, {"amount": 5}, key, client=english)
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert again["Content-Language"] == "zh-hans"


def test_replay_comes_from_the_database_when_redis_forgot(alice, key, needs_redis):
    first = alice.post(DEPOSITS, {"amount": 5}, key)
    get_redis().flushdb()
    again = alice.post(DEPOSITS, {"amount": 5}, key)
    assert again.content == first.content and again["Idempotent-Replayed"] == "true"
    assert alice.deposits() == 1


def test_key_order_and_whitespace_do_not_change_the_request(alice, key):
    alice.post(DEPOSITS, '{"amount": 5, "sleep": 0}', key)
    again = alice.post(DEPOSITS, '{ "sleep":0,\n"amount":5 }', key)
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert alice.deposits() == 1


def test_same_key_other_body_is_422_naming_the_fields(alice, key, both_paths):
    alice.post(DEPOSITS, {"amount": 5}, key)
    body = assert_problem(
        alice.post(DEPOSITS, {"amount": 6, "sleep": 0}, key),
        422,
        "idempotency_key_reused",
    )
    assert body["fields"] == ["amount", "sleep"]
    assert "amount, sleep" in body["detail"]
    assert alice.deposits() == 1


def test_same_key_other_endpoint_is_422(alice, key):
    alice.post(DEPOSITS, {"amount": 5}, key)
    body = assert_problem(
        alice.post("/test/phased-deposits", {"amount": 5}, key),
        422,
        "idempotency_key_reused",
    )
    assert "POST /test/deposits" in body["detail"]
    assert alice.deposits() == 1


def test_a_business_refusal_is_stored_and_its_effects_undone(alice, key, both_paths):
    first = alice.post(DEPOSITS, {"amount": 5, "fail": "refuse"}, key)
    assert_problem(first, 422, "insufficient_funds")
    assert alice.deposits() == 0  # the deposit the view made rolled back
    again = alice.post(DEPOSITS, {"amount": 5, "fail": "refuse"}, key)
    assert again.content == first.content and again["Idempotent-Replayed"] == "true"
    assert IdempotencyRecord.objects.get(key=key).status == "failed"


@pytest.mark.parametrize("body", [{"amount": "lots"}, '{"amount": '])
def test_invalid_input_is_not_stored_and_frees_the_key(alice, key, both_paths, body):
    # Refused for its form, before the endpoint began executing: the corrected
    # request may use the key.
    first = alice.post(DEPOSITS, body, key)
    assert first.status_code == 400
    assert "Idempotent-Replayed" not in alice.post(DEPOSITS, body, key)
    assert not IdempotencyRecord.objects.filter(key=key).exists()
    corrected = alice.post(DEPOSITS, {"amount": 5}, key)
    assert corrected.status_code == 201 and "Idempotent-Replayed" not in corrected
    assert alice.deposits() == 1


def test_invalid_input_to_a_phased_endpoint_frees_the_key(alice, key, both_paths):
    # Its `processing` record was committed before the view refused the body.
    first = alice.post("/test/phased-deposits", {"amount": "lots"}, key)
    assert_problem(first, 400, "validation_error")
    assert not IdempotencyRecord.objects.filter(key=key).exists()
    corrected = alice.post("/test/phased-deposits", {"amount": 5}, key)
    assert corrected.status_code == 201 and "Idempotent-Replayed" not in corrected
    assert alice.deposits() == 1


def test_a_413_is_not_stored(alice, key):
    too_large = alice.post(DEPOSITS, {"amount": 5, "fail": "too_large"}, key)
    assert too_large.status_code == 413
    assert not IdempotencyRecord.objects.filter(key=key).exists()
    assert alice.deposits() == 0


def test_a_crash_is_not_stored_and_the_retry_runs_again(alice, key, both_paths):
    crashing = alice.client()
    crashing.raise_request_exception = False
    first = alice.post(DEPOSITS, {"amount": 5, "fail": "crash_once"}, key, crashing)
    assert first.status_code == 500
    assert alice.deposits() == 0
    assert not IdempotencyRecord.objects.filter(key=key).exists()
    retry = alice.post(DEPOSITS, {"amount": 5, "fail": "crash_once"}, key)
    assert retry.status_code == 201 and "Idempotent-Replayed" not in retry
    assert alice.deposits() == 1


def test_a_429_is_not_stored(alice, key):
    assert (
        alice.post(DEPOSITS, {"amount": 5, "fail": "throttle"}, key).status_code == 429
    )
    assert not IdempotencyRecord.objects.filter(key=key).exists()
    assert alice.deposits() == 0


def test_two_users_with_one_key_never_see_each_other(alice, bob, key, both_paths):
    a = alice.post(DEPOSITS, {"amount": 5}, key)
    b = bob.post(DEPOSITS, {"amount": 7}, key)
    assert a.status_code == b.status_code == 201
    assert "Idempotent-Replayed" not in b
    assert a.json()["amount"] == 5 and b.json()["amount"] == 7
    assert (alice.deposits(), bob.deposits()) == (1, 1)
    status = bob.client().get(f"/api/v1/idempotency-keys/{key}")
    assert status.json()["response_status"] == 201


def test_key_status_endpoint(alice, bob, key):
    client = alice.client()
    assert_problem(client.get(f"/api/v1/idempotency-keys/{key}"), 404, "not_found")
    alice.post(DEPOSITS, {"amount": 5}, key)
    body = client.get(f"/api/v1/idempotency-keys/{key}").json()
    assert body["status"] == "succeeded" and body["response_status"] == 201
    assert body["expires_at"] > body["created_at"]
    assert_problem(
        bob.client().get(f"/api/v1/idempotency-keys/{key}"), 404, "not_found"
    )


def test_an_expired_key_is_forgotten(alice, key, needs_redis):
    alice.post(DEPOSITS, {"amount": 5}, key)
    IdempotencyRecord.objects.filter(key=key).update(expires_at=timezone.now())
    get_redis().flushdb()
    again = alice.post(DEPOSITS, {"amount": 5}, key)
    assert again.status_code == 201 and "Idempotent-Replayed" not in again
    assert alice.deposits() == 2


def test_phased_request_finishes_and_replays(alice, key, both_paths):
    first = alice.post("/test/phased-deposits", {"amount": 5}, key)
    assert first.status_code == 201
    record = IdempotencyRecord.objects.get(key=key)
    assert record.recovery_point == "finished" and record.locked_until is None
    again = alice.post("/test/phased-deposits", {"amount": 5}, key)
    assert again.content == first.content and again["Idempotent-Replayed"] == "true"
    assert alice.deposits() == 1


def test_in_flight_phased_key_is_409_with_retry_after(alice, key, no_redis):
    # A committed processing record whose lease has not passed: the first request is
    # (as far as anyone can tell) still working.
    alice.post("/test/phased-deposits", {"amount": 5}, key)
    IdempotencyRecord.objects.filter(key=key).update(
        status="processing",
        recovery_point="deposited",
        locked_until=timezone.now() + timezone.timedelta(seconds=20),
    )
    response = alice.post("/test/phased-deposits", {"amount": 5}, key)
    assert_problem(response, 409, "idempotency_key_in_flight")
    assert response["Retry-After"] == "1"


def test_expired_lease_is_taken_over_and_resumed(alice, key, no_redis):
    alice.post("/test/phased-deposits", {"amount": 5}, key)
    IdempotencyRecord.objects.filter(key=key).update(
        status="processing",
        recovery_point="deposited",
        locked_until=timezone.now() - timezone.timedelta(seconds=1),
    )
    before = counted("taken_over")
    response = alice.post("/test/phased-deposits", {"amount": 5}, key)
    assert response.status_code == 201 and "Idempotent-Replayed" not in response
    assert alice.deposits() == 1  # resumed after the deposit, not repeated
    assert IdempotencyRecord.objects.get(key=key).recovery_data["resumed"] is True
    assert counted("taken_over") == before + 1


def forget_redis() -> None:
    if (redis := get_redis()) is not None:
        redis.flushdb()


def test_a_claim_that_loses_the_key_after_forgetting_it_is_409_and_runs_nothing(
    alice, key, both_paths, monkeypatch
):
    # A phased claim finds the key's record expired and forgets it, then INSERTs its
    # own; if another request's record landed in between (its INSERT is made here, in
    # the gap), the claim holds no record and no lease: 409, and nothing runs.
    alice.post("/test/phased-deposits", {"amount": 5}, key)
    IdempotencyRecord.objects.filter(key=key).update(
        expires_at=timezone.now() - timezone.timedelta(seconds=1)
    )
    forget_redis()
    find = records.find

    def find_then_lose_the_key(call, **options):
        found = find(call, **options)
        assert found is None  # the expired record, forgotten
        records._insert(records._new(call, status=records.Status.PROCESSING))
        return found

    monkeypatch.setattr(records, "find", find_then_lose_the_key)
    before = counted("executed")
    response = alice.post("/test/phased-deposits", {"amount": 5}, key)
    assert_problem(response, 409, "idempotency_key_in_flight")
    assert alice.deposits() == 1  # the first request's, and no other
    assert counted("executed") == before
    record = IdempotencyRecord.objects.get(key=key)
    assert record.status == "processing" and record.recovery_point == "started"


def test_a_processing_record_past_its_ttl_is_resumed_not_forgotten(
    alice, key, both_paths
):
    # A crash after the deposit committed, retried after the key's time to live: the
    # record is the only memory of the deposit, so it must not expire while processing.
    alice.post("/test/phased-deposits", {"amount": 5}, key)
    past = timezone.now() - timezone.timedelta(seconds=1)
    IdempotencyRecord.objects.filter(key=key).update(
        status="processing",
        recovery_point="deposited",
        locked_until=past,
        expires_at=past,
    )
    forget_redis()
    assert record_purge_expired() == 0
    response = alice.post("/test/phased-deposits", {"amount": 5}, key)
    assert response.status_code == 201 and "Idempotent-Replayed" not in response
    assert alice.deposits() == 1  # resumed after the deposit, not repeated
    record = IdempotencyRecord.objects.get(key=key)
    assert record.finished and record.expires_at > timezone.now()  # TTL from finish


def test_an_expired_key_reused_for_a_refusal_is_refused_afresh(alice, key, both_paths):
    # The view's transaction forgets the expired record and its rollback brings it
    # back: storing the new refusal must forget it again, not answer 409.
    body = {"amount": 5, "fail": "refuse"}
    first = alice.post(DEPOSITS, body, key)
    IdempotencyRecord.objects.filter(key=key).update(expires_at=timezone.now())
    forget_redis()
    again = alice.post(DEPOSITS, body, key)
    assert_problem(again, 422, "insufficient_funds")
    assert again.content == first.content and "Idempotent-Replayed" not in again
    assert IdempotencyRecord.objects.get(key=key).expires_at > timezone.now()


def test_without_a_replay_cache_a_retry_replays_at_once(alice, key, settings):
    # Redis refuses a cache time of 0; the lock must be released all the same, or the
    # retry would be a 409 for a whole lease.
    settings.IDEMPOTENCY_REPLAY_CACHE_SECONDS = 0
    first = alice.post(DEPOSITS, {"amount": 5}, key)
    again = alice.post(DEPOSITS, {"amount": 5}, key)
    assert again.content == first.content and again["Idempotent-Replayed"] == "true"
    assert alice.deposits() == 1


@pytest.mark.parametrize(
    ("action", "body"), [("pay", {"method": "balance"}), ("cancel", {})]
)
def test_a_refusal_on_a_very_long_path_is_stored(alice, key, action, body):
    path = f"/api/v1/orders/{'A' * 600}/{action}"
    first = alice.post(path, body, key)
    assert_problem(first, 404, "not_found")
    again = alice.post(path, body, key)
    assert again.content == first.content and again["Idempotent-Replayed"] == "true"


def test_optional_mode_runs_without_a_key(alice, settings):
    settings.IDEMPOTENCY_ENDPOINTS = {"test.deposit": "optional"}
    assert alice.post(DEPOSITS, {"amount": 5}, key=None).status_code == 201
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.django_db(transaction=True)  # each phase commits on its own
@pytest.mark.parametrize("mode", ["optional", "off"])
def test_a_phased_view_without_the_layer_still_runs_in_phases(alice, settings, mode):
    """Without a key (optional) or a layer (off), a phased view gets phases of its
    own, each committed as it goes, and no record: it once got none at all."""
    settings.IDEMPOTENCY_ENDPOINTS = {"test.phased_deposit": mode}
    response = alice.post("/test/phased-deposits", {"amount": 5}, key=None)
    assert response.status_code == 201, response.content
    assert alice.deposits() == 1
    assert not IdempotencyRecord.objects.exists()


def test_unreachable_redis_falls_back_to_the_database(alice, key, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    before = counted("fallback")
    first = alice.post(DEPOSITS, {"amount": 5}, key)
    again = alice.post(DEPOSITS, {"amount": 5}, key)
    assert first.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert alice.deposits() == 1
    assert counted("fallback") == before + 2


def test_unreachable_redis_can_be_refused_instead(alice, key, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    settings.IDEMPOTENCY_REDIS_FAILURE = "refuse"
    response = alice.post(DEPOSITS, {"amount": 5}, key)
    assert_problem(response, 503, "idempotency_unavailable")
    assert alice.deposits() == 0 and not IdempotencyRecord.objects.exists()


def test_metrics_expose_the_outcomes(alice, key, client):
    alice.post(DEPOSITS, {"amount": 5}, key)
    alice.post(DEPOSITS, {"amount": 5}, key)
    text = client.get("/metrics").content.decode()
    for outcome in ("executed", "replayed", "in_flight", "reused", "missing"):
        assert f'idempotency_requests_total{{outcome="{outcome}"}}' in text
    assert "idempotency_lock_wait_seconds_bucket" in text


def test_a_cached_replay_is_answered_before_django_runs(
    alice, key, django_assert_num_queries, needs_redis
):
    first = alice.post(DEPOSITS, {"amount": 5}, key)
    before = counted("replayed")
    with django_assert_num_queries(0):  # not even the token lookup
        again = alice.post(DEPOSITS, {"amount": 5}, key)
    assert again.content == first.content and again["Idempotent-Replayed"] == "true"
    assert again["Location"] == first["Location"]
    assert counted("replayed") == before + 1
    assert alice.deposits() == 1


def redis_round_trips(monkeypatch) -> list[str]:
    """Record every command this process sends to Redis (they still run for real)."""
    sent: list[str] = []
    client = get_redis()
    assert client is not None
    send = client.execute_command

    def counting(*args, **options):
        sent.append(str(args[0]))
        return send(*args, **options)

    monkeypatch.setattr(client, "execute_command", counting)
    return sent


def test_a_known_caller_executes_in_two_redis_round_trips(
    alice, key, monkeypatch, needs_redis
):
    alice.post(DEPOSITS, {"amount": 5}, f"{key}-earlier")  # Redis now knows alice
    sent = redis_round_trips(monkeypatch)
    response = alice.post(DEPOSITS, {"amount": 5}, key)
    assert response.status_code == 201 and alice.deposits() == 2
    # The middleware's begin took the lock the engine used; finish released it.
    assert sent == ["EVALSHA", "EVALSHA"]
    assert not get_redis().keys("idem:*:lock")
    assert alice.post(DEPOSITS, {"amount": 5}, key)["Idempotent-Replayed"] == "true"


def test_a_redis_that_forgot_the_scripts_is_sent_them_again(
    alice, key, monkeypatch, needs_redis
):
    alice.post(DEPOSITS, {"amount": 5}, f"{key}-earlier")  # the scripts are known
    scripts = fastpath._scripts(get_redis())
    for script in vars(scripts).values():  # as a restarted Redis would answer them
        monkeypatch.setattr(script, "sha", "0" * 40)
    sent = redis_round_trips(monkeypatch)
    response = alice.post(DEPOSITS, {"amount": 5}, key)
    assert response.status_code == 201 and alice.deposits() == 2
    # Each script was refused (NOSCRIPT), loaded, and run again.
    assert sent == ["EVALSHA", "SCRIPT LOAD", "EVALSHA"] * 2
    assert alice.post(DEPOSITS, {"amount": 5}, key)["Idempotent-Replayed"] == "true"


def test_a_lock_no_idempotent_view_adopts_is_released(alice, key, needs_redis):
    alice.post(DEPOSITS, {"amount": 5}, f"{key}-earlier")
    # The middleware takes the lock before it knows where the request goes.
    missing = alice.post("/test/no-such-endpoint", {"amount": 5}, key)
    assert missing.status_code == 404
    assert not get_redis().keys("idem:*:lock")
    assert alice.post(DEPOSITS, {"amount": 5}, key).status_code == 201


def test_the_shortcut_never_answers_another_token_or_request(alice, bob, key):
    alice.post(DEPOSITS, {"amount": 5}, key)
    # Bob's token maps to Bob's scope: his request with Alice's key runs for him.
    assert "Idempotent-Replayed" not in bob.post(DEPOSITS, {"amount": 5}, key)
    # An unknown token is never answered from the cache: DRF refuses it.
    stranger = alice.client()
    stranger.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    refused = alice.post(DEPOSITS, {"amount": 5}, key, stranger)
    assert_problem(refused, 401, "authentication_failed")
    # Another body under the same key falls through to the engine's 422.
    assert_problem(
        alice.post(DEPOSITS, {"amount": 6}, key), 422, "idempotency_key_reused"
    )


def test_the_one_statement_insert_writes_the_record_the_model_would():
    """`insert_finished` on PostgreSQL is hand-written SQL: it must name every column
    (a field added to the model and not to it would be NULL, or fail the INSERT), and
    write what the model's own record (`_finished`) holds."""
    from idempotency.records import (
        Call,
        StoredResponse,
        _finished,
        _finished_insert,
        insert_finished,
    )

    head = _finished_insert(60).split(" VALUES ")[0]
    named = set(re.findall(r'"(\w+)"', head)) - {IdempotencyRecord._meta.db_table}
    columns = {field.column for field in IdempotencyRecord._meta.concrete_fields}
    assert named == columns - {"id", "locked_until"}  # (an id of its own; no lease)

    call = Call("user:1", "k-insert", "orders.create", "POST", "/x", "f", {"a": "1"})
    stored = StoredResponse("f", 201, {"Location": "/y"}, b'{"id": 1}')
    with connection.cursor() as cursor:
        assert insert_finished(call, stored, cursor)
        assert not insert_finished(call, stored, cursor)  # no second record
    written = IdempotencyRecord.objects.get(scope="user:1", key="k-insert")
    expected = _finished(call, stored)
    for field in IdempotencyRecord._meta.concrete_fields:
        if field.name not in {"id", "created_at", "expires_at"}:
            got, want = getattr(written, field.name), getattr(expected, field.name)
            if field.name == "response_body":
                got = bytes(got)  # (a memoryview from PostgreSQL)
            assert got == want, field.name
    lifetime = written.expires_at - written.created_at
    assert abs(lifetime.total_seconds() - settings.IDEMPOTENCY_TTL_SECONDS) < 1
