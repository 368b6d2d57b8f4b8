from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from idempotency.models import IdempotencyRecord
from idempotency.services import record_purge_expired, record_release_stuck
from tests.conftest import run_in_threads

pytestmark = pytest.mark.django_db


def make(n: int, *, expired: bool, tag: str = "", **values) -> None:
    now = timezone.now()
    offset = timedelta(seconds=-1 if expired else 3600)
    IdempotencyRecord.objects.bulk_create(
        IdempotencyRecord(
            scope="user:1",
            key=f"{'old' if expired else 'new'}-{tag}-{i}",
            endpoint="test",
            method="POST",
            path="/x",
            fingerprint="f",
            status=values.get("status", "succeeded"),
            recovery_point=values.get("recovery_point", "finished"),
            locked_until=values.get("locked_until"),
            expires_at=now + offset,
        )
        for i in range(n)
    )


def test_purge_deletes_only_expired_records_in_batches(django_assert_max_num_queries):
    make(5, expired=True)
    make(3, expired=False)
    # 3 batches of 2 (the last one short), each a small transaction of its own:
    # savepoint, select ids, delete, release (the test itself runs in a transaction).
    with django_assert_max_num_queries(3 * 4):
        assert record_purge_expired(batch_size=2) == 5
    assert IdempotencyRecord.objects.count() == 3
    assert not IdempotencyRecord.objects.filter(expires_at__lte=timezone.now()).exists()


def test_purge_command():
    make(2, expired=True)
    out = StringIO()
    call_command("purge_idempotency_keys", stdout=out)
    assert "deleted 2" in out.getvalue()


def test_release_stuck_frees_only_keys_with_nothing_committed():
    long_ago = timezone.now() - timedelta(minutes=10)
    make(
        2,
        expired=False,
        tag="a",
        status="processing",
        recovery_point="started",
        locked_until=long_ago,
    )
    make(
        1,
        expired=False,
        tag="b",
        status="processing",
        recovery_point="deposited",
        locked_until=long_ago,
    )
    make(
        1,
        expired=False,
        tag="c",
        status="processing",
        recovery_point="started",
        locked_until=timezone.now() + timedelta(seconds=30),
    )
    assert record_release_stuck(grace_seconds=60) == 2
    left = set(IdempotencyRecord.objects.values_list("recovery_point", flat=True))
    assert left == {"deposited", "started"}  # past a recovery point, or still leased
    out = StringIO()
    call_command("release_stuck_idempotency_keys", stdout=out)
    assert "released 0" in out.getvalue()


def test_purge_walks_the_key_upwards_and_rests_between_batches(monkeypatch):
    make(5, expired=True)
    rests: list[float] = []
    monkeypatch.setattr("idempotency.sql.time.sleep", rests.append)
    with CaptureQueriesContext(connection) as captured:
        assert record_purge_expired(batch_size=2) == 5
    picks = [q["sql"] for q in captured if q["sql"].startswith("SELECT")]
    # Each batch after the first starts above the last one's highest id, so it never
    # walks again over the dead index entries its predecessors left.
    assert len(picks) == 3
    assert '"id" >' not in picks[0]
    assert all('"id" >' in sql for sql in picks[1:])
    # A rest after each full batch (as long as the batch took), none after the last.
    assert len(rests) == 2
    assert all(0 <= rest <= 1.0 for rest in rests)


@pytest.mark.django_db(transaction=True)
def test_a_purge_batch_commits_asynchronously_and_only_itself(monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("synchronous_commit is PostgreSQL's")
    make(3, expired=True)
    monkeypatch.setattr("idempotency.sql.time.sleep", lambda seconds: None)
    with CaptureQueriesContext(connection) as captured:
        assert record_purge_expired(batch_size=2) == 3
    sets = [q["sql"] for q in captured if q["sql"].startswith("SET LOCAL")]
    assert sets == ["SET LOCAL synchronous_commit = off"] * 2  # one per batch
    with connection.cursor() as cursor:  # the session itself commits as before
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"
    # Inside a caller's transaction, the caller's writes keep their durable commit.
    make(1, expired=True, tag="inside")
    with transaction.atomic(), CaptureQueriesContext(connection) as captured:
        assert record_purge_expired() == 1
    assert not [q for q in captured if q["sql"].startswith("SET")]
    # And in one the caller opened by turning autocommit off.
    make(1, expired=True, tag="manual")
    transaction.set_autocommit(False)
    try:
        with CaptureQueriesContext(connection) as captured:
            assert record_purge_expired() == 1
        transaction.commit()
    finally:
        transaction.set_autocommit(True)
    assert not [q for q in captured if q["sql"].startswith("SET")]


@pytest.mark.parametrize(
    "args",
    [
        ["release_stuck_idempotency_keys", "--grace-seconds", "-3600"],
        ["release_stuck_idempotency_keys", "--grace-seconds", "99999999999999"],
        ["purge_idempotency_keys", "--batch-size", "-1"],
        ["purge_idempotency_keys", "--batch-size", "0"],
        ["purge_idempotency_keys", "--rest", "-1"],
        ["purge_idempotency_keys", "--rest", "nan"],
        ["purge_idempotency_keys", "--max-seconds", "inf"],
        ["purge_idempotency_keys", "--max-seconds", "-5"],
    ],
)
def test_housekeeping_commands_refuse_bad_numbers_and_delete_nothing(args):
    """A negative grace would release keys whose requests still run (their lease
    is live); other values failed with a traceback, or did nothing silently."""
    make(1, expired=True)
    make(
        1,
        expired=False,
        tag="live",
        status="processing",
        recovery_point="started",
        locked_until=timezone.now() + timedelta(seconds=30),
    )
    with pytest.raises(CommandError, match=f"--{args[1][2:]} is "):
        call_command(*args)
    assert IdempotencyRecord.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_release_racing_the_clients_retries_leaves_the_key_to_one_of_them(
    on_postgres,
):
    """Beat's release of a stuck key (twice: a redelivered task) runs while the
    client retries it from three threads: the key is released, or taken over, or
    claimed afresh, and in every case at most one retry holds it; the others are
    told it is busy or in flight, and none fails."""
    from idempotency.records import Claimed, claim
    from tests.backoffice import call_of, stuck
    from tests.conftest import run_in_threads

    for _ in range(5):
        IdempotencyRecord.objects.all().delete()
        record = stuck()  # its lease passed five minutes ago
        call = call_of(record)

        def work(i: int, call=call):
            if i < 2:
                return record_release_stuck(grace_seconds=60)
            return claim(call).outcome

        results = run_in_threads(5, work)
        assert not any(isinstance(r, Exception) for r in results), results
        holders = [r for r in results[2:] if r in (Claimed.NEW, Claimed.TAKEN_OVER)]
        assert len(holders) <= 1, results
        assert sum(results[:2]) <= 1, results
        left = IdempotencyRecord.objects.filter(key=record.key).first()
        if holders:
            assert left is not None and left.locked_until > timezone.now()
        else:
            assert left is None or left.locked_until < timezone.now(), results


@pytest.mark.django_db(transaction=True)
def test_a_purge_racing_retries_of_an_expired_key_never_deletes_the_new_record(
    on_postgres, settings
):
    """A key past its time to live is forgotten: its retry runs afresh, once,
    however many retries race each other and the purge (beat's, delivered twice).
    The purge picks the expired record and deletes it re-checking that it still
    is expired, so the record the retry wrote in its place stays, and a later
    retry replays it instead of moving the money a third time."""
    from ledger.models import Transfer
    from tests.conftest import run_in_threads
    from tests.helpers import balance, customer, new_key

    # The record is aged by hand below: no cached replay may outlive it (a real
    # one never does, it is cached for at most the record's time to live).
    settings.IDEMPOTENCY_REPLAY_CACHE_SECONDS = 0
    _, _, wallet = customer("alice", balance=10_000)
    customer("bob")
    key = new_key()
    body = {"to": "bob", "amount": 100, "currency": "CNY"}

    def send():
        _, again, _ = customer("alice")
        return again.post(
            "/api/v1/transfers", body, format="json", headers={"Idempotency-Key": key}
        )

    assert send().status_code == 201
    IdempotencyRecord.objects.filter(key=key).update(
        expires_at=timezone.now() - timedelta(seconds=5)
    )

    def work(i: int):
        if i < 2:
            return record_purge_expired(rest=0)
        return send().status_code

    results = run_in_threads(6, work)
    assert set(results[2:]) <= {201, 409}, results
    assert Transfer.objects.count() == 2  # the first, and the one run afresh
    assert balance(wallet) == 10_000 - 200
    (record,) = IdempotencyRecord.objects.filter(key=key)
    assert record.finished and record.expires_at > timezone.now()
    later = send()
    assert later.status_code == 201
    assert later.headers["Idempotent-Replayed"] == "true"
    assert Transfer.objects.count() == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.urls("tests.idempotency.urls")
def test_two_purges_at_once_while_clients_reuse_and_replay_keys(
    on_postgres, alice, no_redis
):
    """Beat's purge sent twice (two beats, a slow run overlapping the next) while
    clients retry keys whose records expired (each runs afresh: the engine forgets
    the expired record and writes a new one) and replay live keys. Each expired
    record goes once, by a purge or by its retry; nothing live goes; no errors."""
    from idempotency.tasks import purge_expired_keys

    make(1000, expired=True, tag="before")
    atomic, phased = "/test/deposits", "/test/phased-deposits"
    reused = [(f"reused-{i}", atomic if i % 2 else phased) for i in range(20)]
    live = [(f"live-{i}", atomic if i % 2 else phased) for i in range(20)]
    for key, path in reused + live:
        assert alice.post(path, {"amount": 5}, key).status_code == 201
    make(1000, expired=True, tag="after")
    make(5, expired=True, tag="stuck", status="processing", recovery_point="deposited")
    IdempotencyRecord.objects.filter(key__startswith="reused-").update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    kept = dict(
        IdempotencyRecord.objects.filter(key__startswith="live-").values_list(
            "key", "pk"
        )
    )

    def work(i: int):
        if i < 2:
            return purge_expired_keys()
        client = alice.client()
        keys = reused if i == 2 else live
        return [alice.post(path, {"amount": 5}, key, client) for key, path in keys]

    purged_a, purged_b, retried, replayed = run_in_threads(4, work)

    assert isinstance(purged_a, int) and isinstance(purged_b, int), (purged_a, purged_b)
    assert [r.status_code for r in retried] == [201] * 20
    assert not any(r.has_header("Idempotent-Replayed") for r in retried)
    assert [r.status_code for r in replayed] == [201] * 20
    assert all(r["Idempotent-Replayed"] == "true" for r in replayed)
    # The 2,000 expired records each purged once; the reused keys' old records
    # went by the purge or by their retry, never counted twice.
    assert 2000 <= purged_a + purged_b <= 2020
    records = IdempotencyRecord.objects
    assert not records.filter(key__contains="-before-").exists()
    assert not records.filter(key__contains="-after-").exists()
    assert records.filter(key__contains="-stuck-").count() == 5
    assert (
        dict(records.filter(key__startswith="live-").values_list("key", "pk")) == kept
    )
    fresh = records.filter(key__startswith="reused-")
    assert fresh.count() == 20
    assert not fresh.filter(expires_at__lte=timezone.now()).exists()
    assert alice.deposits() == 20 * 2 + 20


@pytest.mark.parametrize(
    "bad", ["abc", "60", float("nan"), float("inf"), -1, True, None]
)
def test_the_purge_task_refuses_a_bad_max_seconds_and_deletes_nothing(bad):
    from idempotency.tasks import purge_expired_keys

    make(3, expired=True)
    with pytest.raises(ValueError, match="max_seconds is 0 to"):
        purge_expired_keys(bad)
    assert IdempotencyRecord.objects.count() == 3
    assert purge_expired_keys(0.5) == 3
