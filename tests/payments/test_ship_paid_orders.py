"""Paid orders left without a shipment (paid from the wallet or by a capture before
every way of paying created one): `check_ledger` names them, `ship_paid_orders`
creates each one's shipment once."""

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction

from ledger.invariants import ledger_report
from orders.models import Order
from payments.models import Shipment
from payments.services import (
    payment_pay_with_balance,
    payment_refund,
    shipment_create_for_paid_order,
)
from tests.conftest import run_in_threads
from tests.helpers import customer, place_order

pytestmark = pytest.mark.django_db


def paid_before_shipments(user, amount: int = 100) -> Order:
    """An order paid from the wallet as the release before shipments left it."""
    order = place_order(user, amount=amount)
    with transaction.atomic():
        payment_pay_with_balance(order_id=order.pk)
    Shipment.objects.filter(order=order).delete()
    return order


def ship(*args: str) -> list[dict]:
    out = StringIO()
    call_command("ship_paid_orders", *args, stdout=out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def not_shipped_warnings() -> list[str]:
    return [w for w in ledger_report()["warnings"] if "shipment" in w]


def test_check_ledger_names_them_and_the_command_ships_each_once():
    user, _, _ = customer("alice", balance=10_000)
    first, second = paid_before_shipments(user), paid_before_shipments(user)
    shipped = place_order(user)
    with transaction.atomic():
        payment_pay_with_balance(order_id=shipped.pk)  # has its shipment
    assert not_shipped_warnings() == [
        f"order {first.merchant_order_no} is paid but has no shipment",
        f"order {second.merchant_order_no} is paid but has no shipment",
    ]
    lines = ship()
    assert [(line["merchant_order_no"], line["created"]) for line in lines] == [
        (first.merchant_order_no, True),
        (second.merchant_order_no, True),
    ]
    assert Shipment.objects.count() == 3
    assert not_shipped_warnings() == []
    # run again, or for a named order: nothing more
    assert ship() == []
    (again,) = ship("--order", first.merchant_order_no)
    assert again["created"] is False and again["shipment"] is None
    assert Shipment.objects.count() == 3


def test_a_long_list_is_cut_and_counted(monkeypatch):
    from payments import invariants

    monkeypatch.setattr(invariants, "NOT_SHIPPED_NAMED", 2)
    user, _, _ = customer("alice", balance=10_000)
    for _ in range(5):
        paid_before_shipments(user)
    warnings = not_shipped_warnings()
    assert len(warnings) == 3
    assert warnings[-1] == (
        "and 3 more paid orders have no shipment (manage.py ship_paid_orders)"
    )


def test_an_order_refunded_or_unpaid_is_not_shipped():
    user, _, _ = customer("alice", balance=10_000)
    order = paid_before_shipments(user)
    with transaction.atomic():
        payment_refund(payment_id=order.payments.get().pk)
    unpaid = place_order(user)
    lines = ship(
        "--order", order.merchant_order_no, "--order", unpaid.merchant_order_no
    )
    assert [line["created"] for line in lines] == [False, False]
    assert [line["order_status"] for line in lines] == ["refunded", "pending_payment"]
    assert not Shipment.objects.exists()


@pytest.mark.parametrize("number", ["nope", "", "1" * 40, "12\x0034"])
def test_an_unknown_order_is_refused_and_nothing_is_shipped(number):
    user, _, _ = customer("alice", balance=10_000)
    order = paid_before_shipments(user)
    with pytest.raises(CommandError, match="unknown order") as refused:
        ship("--order", order.merchant_order_no, "--order", number)
    assert refused.value.returncode == 1
    assert not Shipment.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_racing_runs_and_a_refund_ship_at_most_once(on_postgres):
    user, _, _ = customer("alice", balance=10_000)
    orders = [paid_before_shipments(user) for _ in range(2)]

    def work(i: int):
        order = orders[i % 2]
        if i == 7:  # one order is refunded while the others ship it
            with transaction.atomic(durable=True):
                return payment_refund(payment_id=order.payments.get().pk)
        with transaction.atomic(durable=True):
            return shipment_create_for_paid_order(order_id=order.pk)

    results = run_in_threads(8, work)
    assert not [r for r in results if isinstance(r, Exception)], results
    shipments = [r for r in results[:7] if r is not None]
    assert len({s.order_id for s in shipments}) == len(shipments)
    assert Shipment.objects.filter(order=orders[0]).count() == 1
    assert Shipment.objects.filter(order=orders[1]).count() <= 1
    assert Order.objects.get(pk=orders[1].pk).status == Order.Status.REFUNDED
    assert not_shipped_warnings() == []
