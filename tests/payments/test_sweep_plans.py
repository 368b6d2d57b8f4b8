"""Beat's sweeps of provider payments read about as many rows as they return.

The reconciliation and the re-drive of stuck payments run every minute; the rows
they pick are a batch among every payment ever made, the window's settled ones and
the many pending ones asked about lately. Each run of a sweep is replayed here under
`EXPLAIN ANALYZE` on its own statements, on the state each found, and the rows its
scans examined (returned, or read and filtered out) are counted: a plan that reads
the window, or every success ever made, to pick its batch counts thousands. Counts,
not timings, and sequential scans left on: the planner's own choice on tables it
has statistics of.
"""

import json
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from orders.models import Order
from payments.models import Payment
from payments.services import payments_stuck, payments_to_reconcile
from tests.helpers import customer

pytestmark = pytest.mark.django_db

HOUR = 3600
WINDOW = 30 * 86400


class _Replayed(Exception):
    pass


def _payments(user, prefix: str, count: int, **fields) -> list[int]:
    """`count` payments of new orders of `user`'s with `fields`, at once."""
    orders = Order.objects.bulk_create(
        Order(
            owner=user, merchant_order_no=f"{prefix}-{i}", amount=1000, currency="CNY"
        )
        for i in range(count)
    )
    fields = {"method": "provider", "amount": 1000, "currency": "CNY", **fields}
    made = Payment.objects.bulk_create(Payment(order=o, **fields) for o in orders)
    return [p.pk for p in made]


def _examined(plan: dict) -> int:
    """Rows of the table the scans of `plan` read: those they returned and those
    they filtered out (an index's entries of row versions it cannot see are not
    rows read: vacuum removes them)."""
    rows = 0
    if plan["Node Type"].endswith("Scan") and "Relation Name" in plan:
        rows += plan["Actual Rows"] * plan["Actual Loops"]
        rows += plan.get("Rows Removed by Filter", 0)
        rows += plan.get("Rows Removed by Index Recheck", 0)
    return rows + sum(_examined(child) for child in plan.get("Plans", []))


def _run_examined(sweep) -> tuple[list[int], int]:
    """What one run of `sweep` returns, and the rows its statements examined,
    replayed in order under EXPLAIN ANALYZE (each on the state the ones before it
    left); both rolled back."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE payments_payment")
    try:
        with transaction.atomic(), CaptureQueriesContext(connection) as captured:
            returned = sweep()
            raise _Replayed
    except _Replayed:
        pass
    statements = [
        q["sql"] for q in captured if q["sql"].startswith(("SELECT", "UPDATE"))
    ]
    assert statements, "the sweep sent no query: nothing was checked"
    examined = 0
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            for sql in statements:
                cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
                (document,) = cursor.fetchone()
                if isinstance(document, str):
                    document = json.loads(document)
                examined += _examined(document[0]["Plan"])
            raise _Replayed
    except _Replayed:
        pass
    return returned, examined


def _to_reconcile(window: int = WINDOW) -> list[int]:
    return payments_to_reconcile(
        settled_within_seconds=window, asked_every_seconds=HOUR, limit=100
    )


def test_reconciling_reads_the_batch_not_the_window_nor_the_past(on_postgres):
    """3,000 payments settled long ago, 2,000 within the window asked ten minutes
    ago: a run that asks about 5 reads about those 5 (before, it read the 2,005 of
    the window to pick them)."""
    user, _, _ = customer("wren")
    now = timezone.now()
    settled = {"status": Payment.Status.SUCCEEDED}
    _payments(user, "old", 3000, succeeded_at=now - timedelta(days=400), **settled)
    assert _to_reconcile() == []  # takes them out of its index, once
    _payments(
        user,
        "asked",
        2000,
        succeeded_at=now - timedelta(days=3),
        provider_asked_at=now - timedelta(minutes=10),
        **settled,
    )
    never = _payments(user, "never", 3, succeeded_at=now - timedelta(days=1), **settled)
    due = _payments(
        user,
        "due",
        2,
        succeeded_at=now - timedelta(days=2),
        provider_asked_at=now - timedelta(hours=2),
        **settled,
    )

    returned, examined = _run_examined(_to_reconcile)

    assert returned == never + due
    assert examined <= 30, examined


def test_reconciling_reads_the_payments_leaving_the_window_once(on_postgres):
    user, _, _ = customer("yael")
    now = timezone.now()
    _payments(
        user,
        "left",
        500,
        status=Payment.Status.SUCCEEDED,
        succeeded_at=now - timedelta(days=31),
        provider_asked_at=now - timedelta(days=1),
    )
    returned, examined = _run_examined(_to_reconcile)
    assert returned == []
    assert examined >= 500  # each read once, to take it out of the index ...
    _to_reconcile()
    returned, examined = _run_examined(_to_reconcile)
    assert returned == []
    assert examined <= 10, examined  # ... and never again


def test_a_window_made_wider_takes_its_payments_in_again():
    user, _, _ = customer("zane")
    now = timezone.now()
    (older,) = _payments(
        user,
        "older",
        1,
        status=Payment.Status.SUCCEEDED,
        succeeded_at=now - timedelta(days=40),
    )
    assert _to_reconcile() == []
    assert Payment.objects.get(pk=older).reconcile_retired
    assert _to_reconcile(window=50 * 86400) == [older]
    assert not Payment.objects.get(pk=older).reconcile_retired
    assert _to_reconcile() == []  # the window as it was: out again


def test_the_stuck_re_drive_reads_its_batch_not_every_pending_payment(on_postgres):
    """2,000 checkouts left open and asked about lately: a run of 100 reads about
    100 (before, every one of the 2,000, to sort them)."""
    user, _, _ = customer("xia")
    now = timezone.now()
    long_ago = now - timedelta(hours=5)
    _payments(user, "open", 2000, created_at=long_ago, provider_asked_at=now)
    fresh = _payments(user, "fresh", 20, created_at=now)  # not stuck yet
    never = _payments(user, "never", 30, created_at=long_ago)
    asked = _payments(
        user,
        "asked",
        70,
        created_at=long_ago,
        provider_asked_at=now - timedelta(hours=1),
    )

    returned, examined = _run_examined(
        lambda: payments_stuck(older_than_seconds=600, limit=100)
    )

    assert returned == never + asked
    assert examined <= 2 * 100 + len(fresh) + 20, examined
