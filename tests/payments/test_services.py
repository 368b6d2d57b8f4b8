import pytest
from django.db import connection, transaction

from ledger.exceptions import InsufficientFunds
from ledger.invariants import ledger_report
from ledger.models import JournalEntry
from ledger.services import merchant_account
from orders.exceptions import OrderAlreadyPaid, OrderNotCancellable, OrderNotPayable
from orders.models import Order
from orders.services import order_cancel
from payments.models import Payment
from payments.services import payment_pay_with_balance
from tests.conftest import run_in_threads
from tests.helpers import balance, customer, place_order

pytestmark = pytest.mark.django_db


def test_pay_with_balance_moves_money_and_marks_the_order_paid():
    user, _, wallet = customer("alice", balance=5000)
    order = place_order(user, amount=1200)
    payment = payment_pay_with_balance(order_id=order.pk)
    assert payment.status == Payment.Status.SUCCEEDED
    assert (payment.amount, payment.currency, payment.method) == (
        1200,
        "CNY",
        "balance",
    )
    assert payment.journal_entry.kind == JournalEntry.Kind.PAYMENT
    assert payment.journal_entry.reference == f"payment:{order.pk}"
    assert balance(wallet) == 3800
    assert balance(merchant_account(currency="CNY")) == 1200
    order.refresh_from_db()
    assert order.status == Order.Status.PAID and order.paid_at is not None
    report = ledger_report()
    assert report["ok"], report
    assert "no_order_paid_twice" in report["checks"]


def test_paying_again_is_refused_and_debits_once():
    user, _, wallet = customer("alice", balance=5000)
    order = place_order(user, amount=1200)
    payment_pay_with_balance(order_id=order.pk)
    with pytest.raises(OrderAlreadyPaid, match="already paid"), transaction.atomic():
        payment_pay_with_balance(order_id=order.pk)
    assert balance(wallet) == 3800
    assert Payment.objects.filter(order=order).count() == 1


def test_not_enough_money_changes_nothing():
    user, _, wallet = customer("alice", balance=1000)
    order = place_order(user, amount=1001)
    with pytest.raises(InsufficientFunds), transaction.atomic():
        payment_pay_with_balance(order_id=order.pk)
    assert balance(wallet) == 1000
    assert not Payment.objects.exists()  # the payment row rolled back too
    order.refresh_from_db()
    assert order.status == Order.Status.PENDING_PAYMENT
    assert ledger_report()["ok"]


def test_a_cancelled_order_cannot_be_paid():
    user, _, wallet = customer("alice", balance=5000)
    order = place_order(user)
    order_cancel(order_id=order.pk)
    with pytest.raises(OrderNotPayable), transaction.atomic():
        payment_pay_with_balance(order_id=order.pk)
    assert balance(wallet) == 5000


def test_database_allows_one_succeeded_payment_per_order():
    from django.db import IntegrityError

    user, _, _ = customer("alice", balance=5000)
    order = place_order(user)
    payment_pay_with_balance(order_id=order.pk)
    second = Payment.objects.create(
        order=order, method="balance", amount=order.amount, currency="CNY"
    )
    second.succeed()
    with pytest.raises(IntegrityError), transaction.atomic():
        second.save()


def test_invariant_names_an_order_paid_twice(on_postgres):
    """Remove the index inside this test's transaction (rolled back afterwards) to show
    the check catches what the index normally prevents."""
    user, _, _ = customer("alice", balance=5000)
    order = place_order(user)
    payment_pay_with_balance(order_id=order.pk)
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX payment_one_success_per_order")
    second = Payment.objects.create(
        order=order, method="balance", amount=order.amount, currency="CNY"
    )
    second.succeed()
    second.save()
    report = ledger_report()
    assert not report["ok"]
    assert f"order {order.merchant_order_no} paid twice" in " ".join(
        report["violations"]
    )


@pytest.mark.django_db(transaction=True)
def test_racing_payments_of_one_order_debit_once(on_postgres):
    user, _, wallet = customer("erin", balance=10_000)
    order = place_order(user, amount=2500)
    results = run_in_threads(8, lambda i: payment_pay_with_balance(order_id=order.pk))
    paid = [r for r in results if isinstance(r, Payment)]
    refused = [r for r in results if isinstance(r, OrderAlreadyPaid)]
    assert (len(paid), len(refused)) == (1, 7), results
    assert balance(wallet) == 7500
    assert Payment.objects.filter(order=order).count() == 1
    assert ledger_report()["ok"]


@pytest.mark.django_db(transaction=True)
def test_racing_payments_of_two_orders_never_overdraw(on_postgres):
    user, _, wallet = customer("frank", balance=3000)
    orders = [place_order(user, amount=2000) for _ in range(2)]
    results = run_in_threads(
        2, lambda i: payment_pay_with_balance(order_id=orders[i].pk)
    )
    assert sum(isinstance(r, Payment) for r in results) == 1, results
    assert sum(isinstance(r, InsufficientFunds) for r in results) == 1, results
    assert balance(wallet) == 1000
    assert ledger_report()["ok"]


@pytest.mark.django_db(transaction=True)
def test_racing_pay_and_cancel_agree(on_postgres):
    user, _, wallet = customer("gina", balance=10_000)
    for _ in range(4):
        order = place_order(user, amount=100)

        def work(i: int, order_id: int = order.pk):
            if i == 0:
                return order_cancel(order_id=order_id)
            return payment_pay_with_balance(order_id=order_id)

        cancel_result, pay_result = run_in_threads(2, work)
        order.refresh_from_db()
        if order.status == Order.Status.PAID:
            assert isinstance(pay_result, Payment)
            assert isinstance(cancel_result, OrderNotCancellable), cancel_result
        else:
            assert isinstance(cancel_result, Order)
            assert order.status == Order.Status.CANCELLED
            assert isinstance(pay_result, OrderNotPayable), pay_result
            assert not order.payments.exists()
    paid = Order.objects.filter(owner=user, status=Order.Status.PAID).count()
    assert balance(wallet) == 10_000 - 100 * paid
    assert ledger_report()["ok"]


def _violations() -> str:
    report = ledger_report()
    assert "orders_match_their_payments" in report["checks"]
    return " | ".join(report["violations"])


def test_invariant_names_money_kept_for_an_order_not_paid():
    """A success kept for an order cancelled meanwhile (the contract refunds it) or
    one paid orders that no payment paid: check_ledger names each."""
    user, _, _ = customer("alice", balance=5000)
    kept = place_order(user)
    payment = payment_pay_with_balance(order_id=kept.pk)
    unpaid = place_order(user)
    refunded = place_order(user)
    assert ledger_report()["ok"]
    Order.objects.filter(pk=kept.pk).update(status=Order.Status.CANCELLED)
    Order.objects.filter(pk=unpaid.pk).update(status=Order.Status.SHIPPED)
    Order.objects.filter(pk=refunded.pk).update(status=Order.Status.REFUNDED)
    violations = _violations()
    assert (
        f"payment {payment.pk} succeeded but its order {kept.merchant_order_no} "
        "is cancelled" in violations
    )
    assert (
        f"order {unpaid.merchant_order_no} is shipped but no payment of it "
        "succeeded" in violations
    )
    assert (
        f"order {refunded.merchant_order_no} is refunded but no payment of it "
        "was refunded" in violations
    )
