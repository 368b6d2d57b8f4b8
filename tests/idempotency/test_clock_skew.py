"""Key leases follow the database's clock, whatever this host's clock says.

The host's clock is skewed by minutes the way the code would read it
(`django.utils.timezone.now`); the database's is left alone. On SQLite the two are one
clock (the database runs inside this process), so these tests are PostgreSQL's.
"""

from datetime import datetime, timedelta

import pytest
from django.db import connection

from idempotency import records
from idempotency.completer import complete_stuck
from idempotency.models import IdempotencyRecord
from idempotency.services import record_purge_expired, record_release_stuck
from idempotency.sql import DatabaseNow

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.idempotency.urls")]
PHASED = "/test/phased-deposits"
MINUTES = timedelta(minutes=10)


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def stuck_after_deposit(alice, key: str, *, lease_left: timedelta) -> None:
    """A phased request whose process died after its deposit committed, its lease
    ending `lease_left` from now by the database's clock."""
    assert alice.post(PHASED, {"amount": 5}, key).status_code == 201
    IdempotencyRecord.objects.filter(key=key).update(
        status="processing",
        recovery_point="deposited",
        locked_until=DatabaseNow(plus=lease_left),
    )


def test_a_host_running_fast_does_not_take_over_a_live_lease(
    alice, key, no_redis, host_clock
):
    stuck_after_deposit(alice, key, lease_left=timedelta(seconds=20))
    host_clock(+MINUTES)  # by this host's clock the lease passed long ago
    response = alice.post(PHASED, {"amount": 5}, key)
    assert response.status_code == 409, response.content
    assert complete_stuck() == 0  # nor does beat's completer on this host
    assert record_release_stuck(grace_seconds=60) == 0
    record = IdempotencyRecord.objects.get(key=key)
    assert record.status == "processing" and record.recovery_point == "deposited"
    assert alice.deposits() == 1


def test_a_host_running_slow_takes_over_a_passed_lease_on_time(
    alice, key, no_redis, host_clock
):
    stuck_after_deposit(alice, key, lease_left=-timedelta(seconds=1))
    host_clock(-MINUTES)  # by this host's clock the lease has minutes to go
    response = alice.post(PHASED, {"amount": 5}, key)
    assert response.status_code == 201 and "Idempotent-Replayed" not in response
    assert alice.deposits() == 1  # resumed after the deposit, not repeated
    assert IdempotencyRecord.objects.get(key=key).recovery_data["resumed"] is True


def test_beats_completer_follows_the_database_clock(alice, key, no_redis, host_clock):
    stuck_after_deposit(alice, key, lease_left=-timedelta(seconds=1))
    host_clock(-MINUTES)
    assert complete_stuck() == 1
    record = IdempotencyRecord.objects.get(key=key)
    assert record.finished and alice.deposits() == 1


def test_new_leases_and_time_to_live_come_from_the_database(
    alice, key, no_redis, host_clock, settings
):
    host_clock(+MINUTES)
    call = records.Call(
        scope="skew", key=key, endpoint="e", method="POST", path="/p",
        fingerprint="f", fields={},
    )  # fmt: skip
    claimed = records.claim(call)
    assert claimed.outcome is records.Claimed.NEW and claimed.locked_until
    lease = timedelta(seconds=settings.IDEMPOTENCY_LEASE_SECONDS)
    assert abs(claimed.locked_until - (db_now() + lease)) < timedelta(seconds=5)
    # The phase's fencing renews the lease by the database's clock too.
    renewed = records.save_recovery_point(
        claimed.record.pk, claimed.locked_until, "step", {}
    )
    assert renewed and abs(renewed - (db_now() + lease)) < timedelta(seconds=5)
    # The old lease is no longer ours: the fencing refuses it.
    pk = claimed.record.pk
    assert records.save_recovery_point(pk, claimed.locked_until, "x", {}) is None
    assert records.save_recovery_point(pk, renewed, "x", {}) is not None

    # An atomic request's record: created now and kept for the TTL, both by the
    # database's clock; a purge on this fast host deletes nothing early.
    assert alice.post("/test/deposits", {"amount": 5}, key).status_code == 201
    record = IdempotencyRecord.objects.get(scope__startswith="user:", key=key)
    assert abs(record.created_at - db_now()) < timedelta(seconds=5)
    ttl = timedelta(seconds=settings.IDEMPOTENCY_TTL_SECONDS)
    assert abs(record.expires_at - (db_now() + ttl)) < timedelta(seconds=5)
    host_clock(ttl + MINUTES)  # a host a day fast
    assert record_purge_expired() == 0
    assert IdempotencyRecord.objects.filter(pk=record.pk).exists()
