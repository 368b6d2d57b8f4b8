"""The order page's buttons pressed at once, from several tabs or browsers of one
shopper: real threads, each with its own connection to PostgreSQL. Every press
answers its 303 back to the order with a message that says what happened; the
money and the stock move once."""

import re

import pytest
from django.test import Client

from ledger.models import JournalEntry
from orders.models import Order, Product
from orders.services import (
    order_create,
    preorder_create,
    product_get_or_create,
    stock_top_up,
)
from payments.models import Payment
from tests.conftest import run_in_threads
from tests.helpers import assert_ledger_ok, balance, customer, place_order

pytestmark = [pytest.mark.django_db(transaction=True)]

MESSAGE = re.compile(r'<li class="message[^"]*">([^<]*)<')


def press(user, url: str, data: dict | None = None) -> tuple[int, list[str]]:
    """POST as a browser of `user` does, then read the order page it is sent to
    (from the page's HTML: the test client's `context` is not thread-safe)."""
    browser = Client(raise_request_exception=False)
    browser.force_login(user)
    answer = browser.post(url, data or {})
    if answer.status_code != 303:
        return answer.status_code, []
    page = browser.get(answer["Location"]).content.decode()
    return answer.status_code, MESSAGE.findall(page)


def test_pay_pressed_in_several_tabs_at_once_pays_once(on_postgres):
    user, _, wallet = customer("alice", balance=10_000)
    order = place_order(user, amount=2500)
    url = f"/orders/{order.merchant_order_no}/pay"

    results = run_in_threads(4, lambda i: press(user, url))

    assert [status for status, _ in results] == [303] * 4, results
    said = [m for _, messages in results for m in messages]
    assert said.count("Paid. Thank you!") == 1, said
    assert said.count("You have already paid this order.") == 3, said
    assert balance(wallet) == 7500
    assert Payment.objects.get(order=order).status == Payment.Status.SUCCEEDED
    assert Order.objects.get(pk=order.pk).status == Order.Status.PAID
    assert JournalEntry.objects.filter(kind="payment").count() == 1
    assert_ledger_ok()


def test_cancel_pressed_in_several_tabs_at_once_gives_the_stock_back_once(
    on_postgres,
):
    user, _, _ = customer("alice")
    tea, _ = product_get_or_create(sku="TEA", name="Tea", price=100, currency="CNY")
    stock_top_up(product_id=tea.pk, at_least=5)
    order = order_create(
        owner=user,
        merchant_order_no=preorder_create(owner=user).merchant_order_no,
        items=[("TEA", 2)],
    )
    assert Product.objects.get(pk=tea.pk).stock == 3
    url = f"/orders/{order.merchant_order_no}/cancel"

    results = run_in_threads(4, lambda i: press(user, url))

    assert [status for status, _ in results] == [303] * 4, results
    said = [m for _, messages in results for m in messages]
    assert said.count("Order cancelled.") == 1, said
    assert said.count("This order is already cancelled.") == 3, said
    assert Order.objects.get(pk=order.pk).status == Order.Status.CANCELLED
    assert Product.objects.get(pk=tea.pk).stock == 5


def test_cancel_and_pay_pressed_at_once_end_one_way(on_postgres):
    """One tab cancels while another pays: either the order is paid (and the
    cancel says only an unpaid order can be cancelled) or it is cancelled (and the
    pay says so, having charged nothing); never both, never a 500."""
    user, _, wallet = customer("alice", balance=100_000)
    for _ in range(5):
        before = balance(wallet)
        order = place_order(user, amount=2500)
        base = f"/orders/{order.merchant_order_no}"
        urls = [f"{base}/pay", f"{base}/cancel"]

        (pay_status, paid), (cancel_status, cancelled) = run_in_threads(
            2, lambda i, urls=urls: press(user, urls[i])
        )

        assert pay_status == cancel_status == 303, (paid, cancelled)
        order.refresh_from_db()
        if order.status == Order.Status.PAID:
            assert paid == ["Paid. Thank you!"]
            assert cancelled == ["Only an unpaid order can be cancelled."]
            assert balance(wallet) == before - 2500
        else:
            assert order.status == Order.Status.CANCELLED
            assert cancelled == ["Order cancelled."]
            assert paid == ["This order was cancelled; it cannot be paid."]
            assert balance(wallet) == before
            assert not Payment.objects.filter(
                order=order, status=Payment.Status.SUCCEEDED
            ).exists()
    assert_ledger_ok()


def test_staff_freeze_and_shopper_pay_at_once_never_pay_from_a_frozen_wallet(
    on_postgres, admin_user
):
    """Staff freeze the wallet in the admin while its owner presses Pay in the shop:
    either the payment went through before the freeze (its posting comes before the
    freeze in the wallet's versions) or the shop says the wallet is frozen and
    nothing moved. The freeze itself always takes; never a 500."""
    from ledger.models import Account, Posting
    from ledger.services import account_unfreeze
    from payments.services import payment_reference
    from tests.backoffice import apply_action, messages_of, staff

    user, _, wallet = customer("alice", balance=100_000)
    accounts = "/admin/ledger/account/"
    for _ in range(6):
        before = balance(wallet)
        order = place_order(user, amount=2500)
        seen = Account.objects.get(pk=wallet.pk).status_version
        pay_url = f"/orders/{order.merchant_order_no}/pay"

        def work(i: int, seen=seen, pay_url=pay_url):
            if i == 0:
                answer = apply_action(
                    staff(admin_user),
                    accounts,
                    "freeze",
                    [wallet.pk],
                    **{f"status_{wallet.pk}": seen},
                )
                return answer.status_code, messages_of(answer)
            return press(user, pay_url)

        (froze, told_staff), (paid, told_shopper) = run_in_threads(2, work)

        assert (froze, paid) == (200, 303), (told_staff, told_shopper)
        assert told_staff == [f"{wallet} is now Frozen."], told_staff
        frozen = Account.objects.get(pk=wallet.pk)
        assert frozen.status == Account.Status.FROZEN
        order.refresh_from_db()
        if order.status == Order.Status.PAID:
            assert told_shopper == ["Paid. Thank you!"]
            assert balance(wallet) == before - 2500
            posting = Posting.objects.get(
                account=wallet, entry__reference=payment_reference(order)
            )
            # The freeze came after the payment: it took the wallet's last version.
            assert posting.version == frozen.version - 1
        else:
            assert order.status == Order.Status.PENDING_PAYMENT
            assert told_shopper == [
                "Your wallet is frozen or closed, so it cannot pay; contact support."
            ]
            assert balance(wallet) == before
            assert not Payment.objects.filter(
                order=order, status=Payment.Status.SUCCEEDED
            ).exists()
        account_unfreeze(account_id=wallet.pk)
    assert_ledger_ok()
