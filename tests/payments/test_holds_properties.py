"""Any sequence of orders, authorizations, captures, voids, expiries, payments,
refunds, cancellations and transfers keeps every invariant `check_ledger` proves
(`held` is the sum of the active holds, `available >= 0`, each payment agrees with
its hold, money is conserved), and the wallet's money is exactly what the outcomes
say."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.exceptions import DomainError
from ledger.invariants import ledger_report
from ledger.models import Hold, Transfer
from ledger.services import TransferItem, transfer_create
from orders.services import order_cancel
from payments.models import Payment
from payments.services import (
    payment_authorize_with_balance,
    payment_capture,
    payment_expire,
    payment_pay_with_balance,
    payment_refund,
    payment_void,
)
from tests.helpers import customer, place_order

ORDERS = 4
slots = st.integers(min_value=0, max_value=ORDERS - 1)
amounts = st.integers(min_value=1, max_value=4_000)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("authorize"), slots),
        st.tuples(st.just("pay"), slots),
        st.tuples(st.just("capture"), slots, st.none() | amounts),
        st.tuples(st.just("void"), slots),
        st.tuples(st.just("expire"), slots),
        st.tuples(st.just("cancel"), slots),
        st.tuples(st.just("refund"), slots),
        st.tuples(st.just("order"), amounts),
        st.tuples(st.just("transfer"), amounts),
    ),
    max_size=20,
)


def _payment(order) -> Payment | None:
    return Payment.objects.filter(order=order).order_by("-pk").first()


def apply(op: tuple, orders: list) -> None:
    name = op[0]
    if name == "order":
        orders.append(place_order(orders[0].owner, amount=op[1]))
        return
    if name == "transfer":
        item = TransferItem(to="prop-friend", amount=op[1], currency="CNY")
        transfer_create(sender=orders[0].owner, item=item)
        return
    order = orders[op[1] % len(orders)]
    payment = _payment(order)
    if name == "authorize":
        payment_authorize_with_balance(order_id=order.pk, hold_seconds=3600)
    elif name == "pay":
        payment_pay_with_balance(order_id=order.pk)
    elif name == "cancel":
        order_cancel(order_id=order.pk)
    elif payment is None:
        return
    elif name == "capture":
        payment_capture(payment_id=payment.pk, amount=op[2])
    elif name == "void":
        payment_void(payment_id=payment.pk)
    elif name == "expire":
        past = timezone.now() - timedelta(seconds=1)
        Hold.objects.filter(payment=payment, status="active").update(expires_at=past)
        payment_expire(payment_id=payment.pk)
    elif name == "refund":
        payment_refund(payment_id=payment.pk)


@pytest.mark.django_db
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=operations, amounts=st.lists(amounts, min_size=ORDERS, max_size=ORDERS))
def test_any_sequence_keeps_holds_and_money_exact(ops, amounts):
    with transaction.atomic():
        user, _, wallet = customer("prop", balance=6_000)
        customer("prop-friend")
        orders = [place_order(user, amount=a) for a in amounts]
        for op in ops:
            try:
                with transaction.atomic():
                    apply(op, orders)
            except (DomainError, ValueError):
                pass  # refused: it must leave no trace, the report checks that
        report = ledger_report()
        assert report["ok"], report["violations"]
        wallet.refresh_from_db()
        payments = Payment.objects.filter(order__owner=user)
        spent = sum(p.amount for p in payments.filter(status="succeeded"))
        held = sum(p.authorized_amount for p in payments.filter(status="authorized"))
        sent = sum(t.amount for t in Transfer.objects.filter(sender=user))
        assert (wallet.balance, wallet.held) == (6_000 - spent - sent, held)
        assert 0 <= wallet.held <= wallet.balance
        transaction.set_rollback(True)
