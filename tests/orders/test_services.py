from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from django_fsm import ConcurrentTransition

from idempotency.snowflake import _process, snowflake_parts
from orders.exceptions import (
    DuplicateOrder,
    MerchantOrderNoUnknown,
    OrderNotCancellable,
    OrderTransitionNotAllowed,
)
from orders.models import Order, PreOrder
from orders.services import (
    _TRANSITION_DONE,
    order_cancel,
    order_complete,
    order_create,
    order_mark_paid,
    order_ship,
    preorder_create,
    preorder_purge_expired,
)
from orders.tasks import purge_expired_preorders
from tests.conftest import run_in_threads
from tests.factories import PreOrderFactory, UserFactory
from tests.helpers import place_order

pytestmark = pytest.mark.django_db


def create(user, no: str, amount: int = 1000) -> Order:
    return order_create(owner=user, merchant_order_no=no, amount=amount, currency="CNY")


def test_preorder_issues_fresh_time_ordered_numbers(settings):
    settings.PREORDER_TTL_SECONDS = 600
    user = UserFactory()
    first, second = preorder_create(owner=user), preorder_create(owner=user)
    assert first.merchant_order_no != second.merchant_order_no
    assert int(first.merchant_order_no) < int(second.merchant_order_no)
    parts = snowflake_parts(int(first.merchant_order_no))
    assert parts.worker_id == _process.worker_id
    lifetime = first.expires_at - first.created_at
    assert timedelta(seconds=599) < lifetime <= timedelta(seconds=601)


def test_order_create_happy_path():
    user = UserFactory()
    preorder = preorder_create(owner=user)
    order = order_create(
        owner=user,
        merchant_order_no=preorder.merchant_order_no,
        amount=2599,
        currency="CNY",
        description="Green tea",
    )
    assert order.status == Order.Status.PENDING_PAYMENT
    assert order.status_name == "pending_payment"
    assert (order.amount, order.currency, order.owner) == (2599, "CNY", user)


def test_second_order_for_a_number_is_a_duplicate_naming_the_first():
    user = UserFactory()
    order = place_order(user)
    with pytest.raises(DuplicateOrder) as caught, transaction.atomic():
        create(user, order.merchant_order_no, amount=5)
    assert f"/api/v1/orders/{order.merchant_order_no}" in caught.value.detail
    assert Order.objects.count() == 1


def test_number_never_issued_is_unknown():
    with pytest.raises(MerchantOrderNoUnknown), transaction.atomic():
        create(UserFactory(), "123456789")
    assert not Order.objects.exists()


def test_number_issued_to_someone_else_is_unknown():
    preorder = preorder_create(owner=UserFactory())
    with pytest.raises(MerchantOrderNoUnknown), transaction.atomic():
        create(UserFactory(), preorder.merchant_order_no)
    assert not Order.objects.exists()


def test_expired_unused_number_is_unknown():
    preorder = PreOrderFactory(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(MerchantOrderNoUnknown, match="expired"), transaction.atomic():
        create(preorder.owner, preorder.merchant_order_no)
    assert not Order.objects.exists()


def test_expired_number_that_was_used_still_answers_duplicate():
    user = UserFactory()
    order = place_order(user)
    order.owner.preorders.update(expires_at=timezone.now() - timedelta(days=1))
    with pytest.raises(DuplicateOrder), transaction.atomic():
        create(user, order.merchant_order_no)


@pytest.mark.parametrize("amount", [0, -1, True, 1.5, "100"])
def test_order_create_refuses_a_bad_amount(amount):
    user = UserFactory()
    preorder = preorder_create(owner=user)
    with pytest.raises(ValueError, match="positive integer"):
        create(user, preorder.merchant_order_no, amount=amount)


def test_database_refuses_what_the_service_would_refuse():
    user = UserFactory()
    order = place_order(user)
    with pytest.raises(IntegrityError), transaction.atomic():
        Order.objects.create(
            owner=user,
            merchant_order_no=order.merchant_order_no,
            amount=1,
            currency="X",
        )
    with pytest.raises(IntegrityError), transaction.atomic():
        Order.objects.create(owner=user, merchant_order_no="x", amount=0, currency="X")


@pytest.mark.django_db(transaction=True)
def test_racing_creates_for_one_number_make_one_order(on_postgres):
    user = UserFactory()
    no = preorder_create(owner=user).merchant_order_no
    results = run_in_threads(8, lambda i: create(user, no, amount=100 + i))
    created = [r for r in results if isinstance(r, Order)]
    duplicates = [r for r in results if isinstance(r, DuplicateOrder)]
    assert len(created) == 1, results
    assert len(duplicates) == 7, results
    assert Order.objects.filter(merchant_order_no=no).count() == 1


def test_status_is_protected_from_direct_assignment():
    order = place_order(UserFactory())
    with pytest.raises(AttributeError):
        order.status = Order.Status.PAID


def test_cancel_a_pending_order():
    order = place_order(UserFactory())
    cancelled = order_cancel(order_id=order.pk)
    assert cancelled.status == Order.Status.CANCELLED
    order.refresh_from_db()
    assert order.status == Order.Status.CANCELLED


def test_cancel_twice_is_refused_the_second_time():
    order = place_order(UserFactory())
    order_cancel(order_id=order.pk)
    with pytest.raises(OrderNotCancellable, match="cancelled"), transaction.atomic():
        order_cancel(order_id=order.pk)


def test_a_paid_order_cannot_be_cancelled():
    order = place_order(UserFactory())
    assert order_mark_paid(order_id=order.pk)
    with pytest.raises(OrderNotCancellable, match="paid"), transaction.atomic():
        order_cancel(order_id=order.pk)
    order.refresh_from_db()
    assert order.status == Order.Status.PAID


def test_mark_paid_never_moves_an_order_backwards():
    order = place_order(UserFactory())
    assert order_mark_paid(order_id=order.pk)
    assert not order_mark_paid(order_id=order.pk)  # a repeated confirmation
    order_ship(order_id=order.pk)
    assert not order_mark_paid(order_id=order.pk)  # a late one
    order.refresh_from_db()
    assert order.status == Order.Status.SHIPPED
    cancelled = place_order(UserFactory())
    order_cancel(order_id=cancelled.pk)
    assert not order_mark_paid(order_id=cancelled.pk)
    cancelled.refresh_from_db()
    assert cancelled.status == Order.Status.CANCELLED


def test_forward_transitions_follow_the_declared_edges():
    order = place_order(UserFactory())
    with pytest.raises(OrderTransitionNotAllowed), transaction.atomic():
        order_ship(order_id=order.pk)  # not paid yet
    order_mark_paid(order_id=order.pk)
    assert order_ship(order_id=order.pk).status == Order.Status.SHIPPED
    assert order_complete(order_id=order.pk).status == Order.Status.COMPLETED
    with pytest.raises(OrderTransitionNotAllowed), transaction.atomic():
        order_complete(order_id=order.pk)


def test_a_refused_transition_says_what_the_order_cannot_be():
    order = place_order(UserFactory())
    no = order.merchant_order_no
    with pytest.raises(OrderTransitionNotAllowed) as refused, transaction.atomic():
        order_ship(order_id=order.pk)
    assert str(refused.value) == (
        f"Order {no} is pending_payment; it cannot be shipped."
    )
    with pytest.raises(OrderTransitionNotAllowed) as refused, transaction.atomic():
        order_complete(order_id=order.pk)
    assert str(refused.value) == (
        f"Order {no} is pending_payment; it cannot be completed."
    )
    order_cancel(order_id=order.pk)
    with pytest.raises(OrderNotCancellable) as refused, transaction.atomic():
        order_cancel(order_id=order.pk)
    assert str(refused.value) == f"Order {no} is cancelled; it cannot be cancelled."


def test_every_edge_of_an_order_has_a_refusal_that_reads_well():
    edges = {t.name for t in Order().get_all_status_transitions()}
    assert edges == set(_TRANSITION_DONE)


def test_a_stale_instance_cannot_save_over_a_newer_state():
    order = place_order(UserFactory())
    stale = Order.objects.get(pk=order.pk)
    order_mark_paid(order_id=order.pk)
    stale.cancel()  # legal from what the stale copy believes
    with pytest.raises(ConcurrentTransition), transaction.atomic():
        stale.save()
    order.refresh_from_db()
    assert order.status == Order.Status.PAID


@pytest.mark.django_db(transaction=True)
def test_racing_cancel_and_paid_confirmation_agree_on_one_outcome(on_postgres):
    for _ in range(5):
        order = place_order(UserFactory())

        def work(i: int, order_id: int = order.pk):
            if i == 0:
                return order_cancel(order_id=order_id).status
            return order_mark_paid(order_id=order_id)

        cancel_result, paid = run_in_threads(2, work)
        order.refresh_from_db()
        if order.status == Order.Status.CANCELLED:
            assert cancel_result == Order.Status.CANCELLED and paid is False
        else:
            assert order.status == Order.Status.PAID and paid is True
            assert isinstance(cancel_result, OrderNotCancellable)


def test_purge_deletes_only_unused_long_expired(django_assert_max_num_queries):
    owner = UserFactory()
    long_ago = timezone.now() - timedelta(days=2)
    unused = PreOrderFactory.create_batch(5, owner=owner, expires_at=long_ago)
    used = PreOrderFactory(owner=owner, expires_at=long_ago)
    Order.objects.create(
        owner=owner, merchant_order_no=used.merchant_order_no, amount=100
    )
    an_hour_ago = timezone.now() - timedelta(hours=1)
    recent = PreOrderFactory(owner=owner, expires_at=an_hour_ago)
    live = PreOrderFactory(owner=owner)
    # Batches of 2, each its own short transaction: savepoint, ids, delete, release.
    with django_assert_max_num_queries(3 * 4):
        assert preorder_purge_expired(grace_seconds=86400, batch_size=2) == 5
    left = set(PreOrder.objects.values_list("pk", flat=True))
    assert left == {used.pk, recent.pk, live.pk}
    assert not left & {p.pk for p in unused}


def test_purge_command_and_task_use_the_setting(settings):
    settings.PREORDER_PURGE_AFTER_SECONDS = 900
    PreOrderFactory(expires_at=timezone.now() - timedelta(minutes=20))
    out = StringIO()
    call_command("purge_preorders", stdout=out)
    assert out.getvalue().strip() == "deleted 1 unused expired pre-order(s)"
    PreOrderFactory(expires_at=timezone.now() - timedelta(minutes=20))
    assert purge_expired_preorders() == 1
    assert not PreOrder.objects.exists()
    hourly = settings.CELERY_BEAT_SCHEDULE["orders-purge-expired-preorders"]
    assert hourly["task"] == purge_expired_preorders.name


def test_purge_refuses_a_grace_an_order_in_progress_could_still_need():
    # A number that expired a minute ago may belong to an order whose transaction
    # has not committed yet: a grace that short is refused, and nothing is deleted.
    PreOrderFactory(expires_at=timezone.now() - timedelta(minutes=1))
    with pytest.raises(ValueError, match="at least 600 s"):
        preorder_purge_expired(grace_seconds=0)
    with pytest.raises(CommandError, match="at least 600 s"):
        call_command("purge_preorders", "--grace-seconds", "-3600")
    assert PreOrder.objects.count() == 1


@pytest.mark.parametrize(
    "args",
    [
        ["--grace-seconds", "99999999999999"],
        ["--batch-size", "-1"],
        ["--batch-size", "0"],
        ["--max-seconds", "nan"],
        ["--max-seconds", "-1"],
    ],
)
def test_purge_refuses_bad_numbers_and_deletes_nothing(args):
    PreOrderFactory(expires_at=timezone.now() - timedelta(days=2))
    with pytest.raises(CommandError, match=f"{args[0]} is "):
        call_command("purge_preorders", *args)
    assert PreOrder.objects.count() == 1


def test_a_numbers_life_is_timed_by_the_database_clock(settings, host_clock):
    # Issued by a host running an hour slow, a number still lives its full time;
    # used through a host an hour fast, it has not expired yet.
    settings.PREORDER_TTL_SECONDS = 600
    host_clock(-timedelta(hours=1))
    preorder = preorder_create(owner=UserFactory())
    stored = PreOrder.objects.get(pk=preorder.pk).expires_at
    assert preorder.expires_at == stored
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s - statement_timestamp()", [stored])
        (left,) = cursor.fetchone()
    assert timedelta(seconds=590) < left <= timedelta(seconds=600)
    host_clock(+timedelta(hours=1))
    order = create(preorder.owner, preorder.merchant_order_no)
    assert order.merchant_order_no == preorder.merchant_order_no


def test_a_fast_host_neither_expires_nor_purges_early(settings, host_clock):
    # A beat host a day fast must not purge a number the database still counts as
    # live (an order for it may be on its way), and a web host a day fast must not
    # call it expired.
    preorder = preorder_create(owner=UserFactory())
    host_clock(+timedelta(days=1))
    assert preorder_purge_expired(grace_seconds=600) == 0
    assert PreOrder.objects.filter(pk=preorder.pk).exists()
    create(preorder.owner, preorder.merchant_order_no)
    # And by the database's clock an expired one is expired, whatever the host says.
    late = PreOrderFactory(expires_at=timezone.now() - timedelta(days=2))
    host_clock(-timedelta(days=3))
    with pytest.raises(MerchantOrderNoUnknown, match="expired"), transaction.atomic():
        create(late.owner, late.merchant_order_no)
    assert preorder_purge_expired(grace_seconds=600) == 1


@pytest.mark.django_db(transaction=True)
def test_two_purges_at_once_while_shoppers_use_and_take_numbers(on_postgres):
    """Beat's pre-order purge sent twice at once while shoppers order with live
    numbers, take new ones and try numbers long expired: the unused long-expired
    numbers go once, nothing used or live goes, every shopper hears a clear answer
    (an order, or "expired"/"unknown"), no errors."""
    owner = UserFactory()
    long_ago = timezone.now() - timedelta(days=2)
    PreOrder.objects.bulk_create(
        PreOrder(owner=owner, merchant_order_no=f"old-{i}", expires_at=long_ago)
        for i in range(1500)
    )
    used = PreOrderFactory.create_batch(5, owner=owner)
    for preorder in used:
        create(owner, preorder.merchant_order_no)
    PreOrder.objects.filter(pk__in=[p.pk for p in used]).update(expires_at=long_ago)
    live = PreOrderFactory.create_batch(20, owner=owner)

    def order(no: str):
        try:
            with transaction.atomic(durable=True):  # as the API's request
                return create(owner, no)
        except MerchantOrderNoUnknown as refused:
            return refused

    def work(i: int):
        if i < 2:
            return purge_expired_preorders()
        if i == 2:
            return [order(p.merchant_order_no) for p in live]
        if i == 3:
            return [order(f"old-{n}") for n in range(0, 1500, 75)]
        return [preorder_create(owner=owner) for _ in range(20)]

    purged_a, purged_b, ordered, refused, taken = run_in_threads(5, work)

    assert purged_a + purged_b == 1500, (purged_a, purged_b)
    assert all(isinstance(o, Order) for o in ordered), ordered
    assert all(isinstance(r, MerchantOrderNoUnknown) for r in refused), refused
    assert all(isinstance(p, PreOrder) for p in taken), taken
    assert not PreOrder.objects.filter(merchant_order_no__startswith="old-").exists()
    kept = {p.pk for p in used + live + taken}
    assert set(PreOrder.objects.values_list("pk", flat=True)) == kept
    assert Order.objects.count() == 5 + 20
