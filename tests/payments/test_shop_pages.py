"""The shopper's pages around payments, through Django's test client: the order
page's live part, the refund button, the payment history and receipts, pages of
every list, entries in the reader's language, the provider's pay page and its way
back, and /favicon.ico. The same pages in a real Chromium: tests/browser."""

import re

import pytest
from django.conf import settings
from django.test import Client
from django.utils import translation
from rest_framework.test import APIClient

from idempotency.models import IdempotencyRecord
from ledger.models import JournalEntry, Posting
from ledger.services import ledger_post, merchant_account, wallet_top_up
from ledger.texts import entry_params, entry_text
from orders.models import Order
from orders.services import order_cancel
from payments.models import Payment, Refund
from payments.provider.models import Charge
from payments.provider.services import charge_create, charge_settle
from payments.services import (
    payment_cancel,
    payment_fail,
    payment_pay_with_balance,
    payment_refund,
    payment_settle,
)
from tests.conftest import run_in_threads
from tests.helpers import balance, customer, pending_provider_payment, place_order

pytestmark = pytest.mark.django_db


@pytest.fixture
def shopper(client):
    user, _, wallet = customer("alice", balance=100_000)
    client.force_login(user)
    return user, wallet


def paid_order(user, amount: int = 2500) -> Order:
    order = place_order(user, amount=amount)
    payment_pay_with_balance(order_id=order.pk)
    order.refresh_from_db()
    return order


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def refund_form(page) -> dict:
    html = page.content.decode()
    token = re.search(r'name="token" value="([^"]+)"', html)
    payment = re.search(r'name="payment" value="(\d+)"', html)
    assert token and payment, html[:3000]
    return {"token": token[1], "payment": payment[1]}


# The order page and its live part -----------------------------------------------------


def test_the_live_part_follows_a_pending_payment_until_it_settles(client, shopper):
    user, _ = shopper
    order = place_order(user, amount=1500)
    url = f"/orders/{order.merchant_order_no}"
    page = client.get(url).content.decode()
    assert 'data-following="0"' in page and 'id="pay-provider"' in page
    assert f'data-url="{url}/live"' in page
    payment = pending_provider_payment(order, txn="Ptest")
    Payment.objects.filter(pk=payment.pk).update(pay_url="http://pay.example/p/1")
    live = client.get(f"{url}/live")
    assert live.status_code == 200 and live["Cache-Control"] == "no-store"
    assert live["X-Order-State"] == f"10;{payment.pk}:pending"
    body = live.content.decode()
    assert 'data-following="1"' in body and 'id="waiting"' in body
    # The pending charge is continued, not opened again; the link is an action.
    assert 'id="continue-pay" href="http://pay.example/p/1"' in body
    assert 'id="pay-provider"' not in body
    assert "<html" not in body  # a part, not a page
    payment_settle(payment_id=payment.pk, provider_txn_id="Ptest")
    settled = client.get(f"{url}/live")
    assert settled["X-Order-State"] == f"20;{payment.pk}:succeeded"
    body = settled.content.decode()
    assert 'data-following="0"' in body
    assert "Payment received. Thank you!" in body  # shown once the poll swaps it in
    # Paid: no other way to pay is offered.
    for gone in ('id="pay"', 'id="pay-provider"', 'id="continue-pay"', "pay.example"):
        assert gone not in body
    assert 'id="refund"' in body


def settled_note(live) -> tuple[str, str]:
    """The live part's note, as the poll shows it: its outcome and its words."""
    match = re.search(
        r'<p class="message message-(\w+)" id="settled-note"[^>]*>(.*?)</p>',
        live.content.decode(),
        re.S,
    )
    assert match, live.content.decode()[:3000]
    return match[1], " ".join(match[2].split())


def test_a_success_after_the_cancel_is_followed_and_told_as_refunded(client, shopper):
    # The payer confirms on the pay page as the order is cancelled: the late success
    # is refunded, and the page says so, not that the payment did not go through.
    user, _ = shopper
    order = place_order(user, amount=1500)
    url = f"/orders/{order.merchant_order_no}/live"
    payment = pending_provider_payment(order, txn="Prace")
    Payment.objects.filter(pk=payment.pk).update(pay_url="http://pay.example/p/3")
    order_cancel(order_id=order.pk)
    cancelled = client.get(url).content.decode()
    # The payment may still settle: the page follows it to its end.
    assert 'data-following="1"' in cancelled and 'id="waiting"' in cancelled
    assert "if it went through, it is refunded" in cancelled
    for gone in ('id="pay"', 'id="pay-provider"', 'id="continue-pay"'):
        assert gone not in cancelled
    payment_settle(payment_id=payment.pk, provider_txn_id="Prace")
    settled = client.get(url)
    assert settled["X-Order-State"] == f"90;{payment.pk}:refunded"
    assert 'data-following="0"' in settled.content.decode()
    assert settled_note(settled) == (
        "info",
        "Your payment came in after the order was cancelled, so it was refunded.",
    )


def test_a_cancelled_charge_of_a_cancelled_order_is_told_as_nothing_charged(
    client, shopper
):
    user, _ = shopper
    order = place_order(user)
    payment = pending_provider_payment(order, txn="Pstop")
    Payment.objects.filter(pk=payment.pk).update(pay_url="http://pay.example/p/4")
    order_cancel(order_id=order.pk)
    payment_cancel(payment_id=payment.pk)
    live = client.get(f"/orders/{order.merchant_order_no}/live")
    assert 'data-following="0"' in live.content.decode()
    assert settled_note(live) == (
        "warning",
        "The order was cancelled; nothing was charged.",
    )


def test_a_declined_payment_is_told_so_with_another_try(client, shopper):
    user, _ = shopper
    order = place_order(user)
    payment = pending_provider_payment(order, txn="Pno")
    payment_fail(payment_id=payment.pk)
    live = client.get(f"/orders/{order.merchant_order_no}/live")
    assert 'id="pay-provider"' in live.content.decode()
    assert settled_note(live) == (
        "warning",
        "The payment was declined. You can try again.",
    )


def test_a_paid_then_refunded_order_is_told_as_refunded(client, shopper):
    user, _ = shopper
    order = paid_order(user)
    payment_refund(payment_id=Payment.objects.get(order=order).pk)
    live = client.get(f"/orders/{order.merchant_order_no}/live")
    assert settled_note(live) == ("info", "The payment was received, then refunded.")


def test_a_paid_order_with_a_forgotten_charge_offers_no_pay_page(client, shopper):
    user, _ = shopper
    order = place_order(user)
    payment = pending_provider_payment(order, txn="Pold")
    Payment.objects.filter(pk=payment.pk).update(pay_url="http://pay.example/p/2")
    payment_pay_with_balance(order_id=order.pk)
    page = client.get(f"/orders/{order.merchant_order_no}").content.decode()
    assert "pay.example" not in page and 'id="pay"' not in page
    assert 'data-following="0"' in page  # nothing to wait for: it is paid


def test_the_live_part_is_the_owners_only(client, shopper):
    other = place_order(customer("bob")[0])
    assert client.get(f"/orders/{other.merchant_order_no}/live").status_code == 404
    assert client.post(f"/orders/{other.merchant_order_no}/live").status_code == 405
    anonymous = Client()
    response = anonymous.get(f"/orders/{other.merchant_order_no}/live")
    assert response.status_code == 302 and "X-Order-State" not in response


# The refund button --------------------------------------------------------------------


def test_refund_button_refunds_once_however_often_pressed(client, shopper):
    user, wallet = shopper
    order = paid_order(user)
    url = f"/orders/{order.merchant_order_no}"
    page = client.get(url)
    assert 'id="refund"' in page.content.decode()
    form = refund_form(page)
    assert balance(wallet) == 100_000 - 2500
    first = client.post(f"{url}/refund", form)
    assert first.status_code == 303 and first["Location"] == url
    # The same form again (a double click without JavaScript, a refresh, a retry):
    # the stored outcome is replayed, and it says the same.
    again = client.post(f"{url}/refund", form)
    assert again.status_code == 303
    assert Refund.objects.count() == 1
    assert balance(wallet) == 100_000
    shown = client.get(url)
    assert messages_of(shown) == [
        "Refunded: the money is back in your wallet.",
        "Refunded: the money is back in your wallet.",
    ]
    assert 'id="refund"' not in shown.content.decode()
    order.refresh_from_db()
    assert order.status == Order.Status.REFUNDED
    assert IdempotencyRecord.objects.filter(key=f"web-refund:{form['token']}").count()
    # Another form (a stale tab) is another key: refused by the service, once.
    stale = client.post(f"{url}/refund", {**form, "token": "another-token-1234567"})
    assert stale.status_code == 303
    assert messages_of(client.get(url)) == ["This payment was already refunded."]
    assert Refund.objects.count() == 1 and balance(wallet) == 100_000
    entry = Refund.objects.get().journal_entry
    assert entry.params == {"text": "order_refund", "order": order.merchant_order_no}
    assert entry.description == f"Refund of order {order.merchant_order_no}"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("same_form", [True, False], ids=["same-form", "two-tabs"])
def test_refund_pressed_in_two_browsers_at_once_refunds_once(on_postgres, same_form):
    user, _, wallet = customer("carol", balance=10_000)
    order = paid_order(user, amount=4000)
    payment = Payment.objects.get(order=order)
    url = f"/orders/{order.merchant_order_no}/refund"

    def press(i: int):
        browser = Client()
        browser.force_login(user)
        token = "same-form-token-0001" if same_form else f"browser-{i}-token-0001"
        response = browser.post(url, {"token": token, "payment": str(payment.pk)})
        # From the page's HTML: the test client's `context` is not thread-safe.
        page = browser.get(url.removesuffix("/refund")).content.decode()
        return response.status_code, re.findall(
            r'<li class="message[^"]*">([^<]*)<', page
        )

    results = run_in_threads(4, press)
    assert all(status == 303 for status, _ in results), results
    assert Refund.objects.filter(payment=payment).count() == 1
    assert balance(wallet) == 10_000
    said = [m for _, messages in results for m in messages]
    made = said.count("Refunded: the money is back in your wallet.")
    if same_form:  # one key: the others replay it or wait for it
        assert (
            made
            + said.count("Your refund is still being made; this page will show it.")
            == 4
        )
    else:  # four keys: one refund, three refusals
        assert made == 1, results
        assert said.count("This payment was already refunded.") == 3


@pytest.mark.parametrize(
    "form",
    [
        {},
        {"token": "short", "payment": "1"},
        {"token": "x" * 200, "payment": "1"},
        {"token": "bad token with spaces!!", "payment": "1"},
        {"token": "a-good-token-000001", "payment": "abc"},
        {"token": "a-good-token-000001", "payment": "-1"},
        # A digit to str.isdigit, not to int(): once a 500.
        {"token": "a-good-token-000001", "payment": "\u00b2"},
        # No row id: past 64 bits, or more digits than int() reads (once a 500).
        {"token": "a-good-token-000001", "payment": "9" * 30},
        {"token": "a-good-token-000001", "payment": "9" * 5000},
    ],
)
def test_a_mangled_refund_form_refunds_nothing(client, shopper, form):
    order = paid_order(shopper[0])
    url = f"/orders/{order.merchant_order_no}"
    response = client.post(f"{url}/refund", form)
    assert response.status_code == 303
    assert messages_of(client.get(url)) == [
        "This form was not valid; please try again."
    ]
    assert not Refund.objects.exists()
    assert not IdempotencyRecord.objects.exists()


def test_refund_of_another_payment_or_order_is_not_found(client, shopper):
    user, _ = shopper
    mine, other_mine = paid_order(user), paid_order(user)
    theirs = paid_order(customer("bob", balance=5000)[0])
    token = {"token": "a-good-token-000001"}
    wrong_order = client.post(
        f"/orders/{mine.merchant_order_no}/refund",
        {**token, "payment": str(other_mine.payments.get().pk)},
    )
    assert wrong_order.status_code == 404
    not_mine = client.post(
        f"/orders/{theirs.merchant_order_no}/refund",
        {**token, "payment": str(theirs.payments.get().pk)},
    )
    assert not_mine.status_code == 404
    assert client.get(f"/orders/{mine.merchant_order_no}/refund").status_code == 405
    assert not Refund.objects.exists()


def test_one_token_for_two_payments_is_refused(client, shopper):
    user, _ = shopper
    first, second = paid_order(user), paid_order(user)
    token = "one-token-two-forms-01"
    for order in (first, second):
        client.post(
            f"/orders/{order.merchant_order_no}/refund",
            {"token": token, "payment": str(order.payments.get().pk)},
        )
    assert Refund.objects.count() == 1
    assert messages_of(client.get("/orders")) == [
        "Refunded: the money is back in your wallet.",
        "This form was not valid; please try again.",
    ]


def test_an_unpaid_order_offers_no_refund(client, shopper):
    order = place_order(shopper[0])
    assert (
        'id="refund"'
        not in client.get(f"/orders/{order.merchant_order_no}").content.decode()
    )
    payment = pending_provider_payment(order)
    client.post(
        f"/orders/{order.merchant_order_no}/refund",
        {"token": "a-good-token-000001", "payment": str(payment.pk)},
    )
    assert messages_of(client.get("/orders")) == ["This payment cannot be refunded."]
    assert not Refund.objects.exists()


# Payment history and receipts ---------------------------------------------------------


def test_payment_history_and_receipts(client, shopper):
    user, _ = shopper
    order = paid_order(user, amount=1234)
    pending = pending_provider_payment(place_order(user, amount=99), txn="Pabc")
    page = client.get("/account/payments")
    assert page.status_code == 200
    html = page.content.decode()
    assert [p.pk for p in page.context["payments"]] == [
        pending.pk,
        order.payments.get().pk,
    ]
    assert "¥12.34" in html and order.merchant_order_no in html
    payment = order.payments.get()
    receipt = client.get(f"/account/payments/{payment.pk}")
    html = receipt.content.decode()
    assert receipt.status_code == 200
    assert 'id="receipt-amount">¥12.34<' in html
    assert f'href="/orders/{order.merchant_order_no}"' in html
    assert "Wallet balance" in html and "receipt-refund" not in html
    client.post(
        f"/orders/{order.merchant_order_no}/refund",
        {"token": "receipt-token-000001", "payment": str(payment.pk)},
    )
    html = client.get(f"/account/payments/{payment.pk}").content.decode()
    assert 'id="receipt-refund"' in html and 'data-status="refunded"' in html
    provider = client.get(f"/account/payments/{pending.pk}").content.decode()
    assert "Pabc" in provider
    # Someone else's receipt, or no receipt at all: not found.
    theirs = paid_order(customer("bob", balance=5000)[0]).payments.get()
    assert client.get(f"/account/payments/{theirs.pk}").status_code == 404
    assert client.get("/account/payments/0").status_code == 404
    assert client.get(f"/account/payments/{10**30}").status_code == 404
    assert client.get("/account/payments/abc").status_code == 404
    assert Client().get("/account/payments").status_code == 302


# Pages of every list ------------------------------------------------------------------


def walk(client, url: str) -> list[list[int]]:
    """Follow "Older" from the first page to the last; the ids on each page."""
    pages = []
    while True:
        response = client.get(url)
        assert response.status_code == 200
        pages.append([item.pk for item in response.context["page"].items])
        older = response.context["page"].older
        if older is None:
            return pages
        assert f'href="?before={older}"' in response.content.decode()
        url = f"{url.split('?')[0]}?before={older}"


def test_orders_payments_and_entries_come_in_pages(client, shopper):
    user, wallet = shopper
    orders = [place_order(user, amount=100 + n) for n in range(45)]
    for order in orders[:25]:
        payment_pay_with_balance(order_id=order.pk)
    newest_first = [o.pk for o in reversed(orders)]
    assert walk(client, "/orders") == [
        newest_first[:20],
        newest_first[20:40],
        newest_first[40:],
    ]
    payment_ids = list(Payment.objects.order_by("-id").values_list("pk", flat=True))
    assert walk(client, "/account/payments") == [payment_ids[:20], payment_ids[20:]]
    posting_ids = list(
        Posting.objects.filter(account=wallet)
        .order_by("-id")
        .values_list("pk", flat=True)
    )
    assert len(posting_ids) == 26  # the deposit and 25 payments
    assert walk(client, "/account") == [posting_ids[:20], posting_ids[20:]]
    # Back up: "Newer" from the second page is the first page.
    second = client.get(f"/orders?before={newest_first[19]}")
    newer = second.context["page"].newer
    assert newer == newest_first[20]
    first = client.get(f"/orders?after={newer}")
    assert [o.pk for o in first.context["page"].items] == newest_first[:20]
    assert first.context["page"].is_first
    # From the third page, "Newer" is a full page of its own.
    third = client.get(f"/orders?before={newest_first[39]}")
    middle = client.get(f"/orders?after={third.context['page'].newer}")
    assert [o.pk for o in middle.context["page"].items] == newest_first[20:40]
    # A cursor that names nothing sensible is the first page, never an error.
    for junk in ("abc", "-5", "0", "9" * 40, "1e9", ""):
        for name in ("before", "after"):
            response = client.get(f"/orders?{name}={junk}")
            assert response.status_code == 200
            items = response.context["page"].items
            assert [o.pk for o in items] == newest_first[:20], (name, junk)


@pytest.mark.parametrize("page", ["/orders", "/account", "/account/payments"])
@pytest.mark.parametrize("query", ["before", "after"])
def test_a_page_named_by_a_non_ascii_digit_is_the_first(client, shopper, page, query):
    # "\u00b2" (superscript two) is a digit to str.isdigit, not to int(): once a 500.
    paid_order(shopper[0])
    response = client.get(f"{page}?{query}=\u00b2")
    assert response.status_code == 200


def test_a_short_list_has_no_pager(client, shopper):
    place_order(shopper[0])
    assert 'class="pager"' not in client.get("/orders").content.decode()


# Entries in the reader's language -----------------------------------------------------


def test_entries_link_to_their_orders_and_read_in_chinese(client, shopper):
    user, wallet = shopper
    order = paid_order(user, amount=2500)
    wallet_top_up(account_id=wallet.pk, at_least=200_000)
    page = client.get("/account").content.decode()
    assert f'<a href="/orders/{order.merchant_order_no}" class="entry-order">' in page
    assert f"Order {order.merchant_order_no}<" in page
    assert ">Top-up<" in page
    client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/account"})
    page = client.get("/account").content.decode()
    assert f"订单 {order.merchant_order_no}<" in page
    assert ">钱包充值<" in page
    assert "Top-up" not in page and f"Order {order.merchant_order_no}" not in page


def test_old_entries_without_params_still_read_in_the_readers_language(shopper):
    """Rows written before `params` existed: recognised by their English text."""
    _, wallet = shopper
    merchant = merchant_account(currency="CNY")
    old = {}
    for kind, text in [
        (JournalEntry.Kind.PAYMENT, "Order 123456789"),
        (JournalEntry.Kind.PAYMENT, "Order 123456789 via provider"),
        (JournalEntry.Kind.REFUND, "Refund of order 123456789"),
        (JournalEntry.Kind.DEPOSIT, "Top-up"),
        (JournalEntry.Kind.DEPOSIT, "Order 42"),  # not a payment: a free text
        (JournalEntry.Kind.TRANSFER, "Lunch money"),
    ]:
        entry = ledger_post(
            reference=f"old:{len(old)}",
            kind=kind,
            currency="CNY",
            legs=[(wallet.pk, -1), (merchant.pk, 1)],
            description=text,
        )
        assert entry.params == {}
        old[text] = entry
    with translation.override("zh-hans"):
        said = {text: entry_text(entry) for text, entry in old.items()}
    assert said == {
        "Order 123456789": "订单 123456789",
        "Order 123456789 via provider": "订单 123456789（第三方支付）",  # noqa: RUF001
        "Refund of order 123456789": "订单 123456789 退款",
        "Top-up": "钱包充值",
        "Order 42": "Order 42",
        "Lunch money": "Lunch money",
    }
    with translation.override("en"):
        assert entry_text(old["Top-up"]) == "Top-up"


def test_entry_params_name_a_known_text_with_its_parameters():
    assert entry_params("order_payment", order="7") == {
        "text": "order_payment",
        "order": "7",
    }
    with pytest.raises(KeyError):
        entry_params("no_such_text")
    with pytest.raises(KeyError):
        entry_params("order_payment")  # its parameter is missing


def test_a_provider_settlement_is_written_with_params(shopper):
    order = place_order(shopper[0])
    payment = pending_provider_payment(order, txn="Pq")
    payment_settle(payment_id=payment.pk, provider_txn_id="Pq")
    entry = Payment.objects.get(pk=payment.pk).journal_entry
    assert entry.params == {
        "text": "order_payment_provider",
        "order": order.merchant_order_no,
    }
    assert entry.description == f"Order {order.merchant_order_no} via provider"


# The provider's pay page --------------------------------------------------------------


def merchant() -> APIClient:
    api = APIClient()
    api.credentials(HTTP_X_MERCHANT_SECRET=settings.PAYMENT_PROVIDER_SECRET)
    return api


def test_the_charge_api_keeps_the_return_url_and_refuses_a_bad_one():
    created = merchant().post(
        "/provider/charges",
        {
            "merchant_order_no": "r-1",
            "amount": 500,
            "currency": "CNY",
            "return_url": "https://shop.example/orders/r-1",
        },
        format="json",
    )
    assert created.status_code == 201
    assert Charge.objects.get().return_url == "https://shop.example/orders/r-1"
    for bad in ("javascript:alert(1)", "not a url", 5, "ftp://x.example/", "h" * 600):
        response = merchant().post(
            "/provider/charges",
            {
                "merchant_order_no": "r-2",
                "amount": 5,
                "currency": "CNY",
                "return_url": bad,
            },
            format="json",
        )
        assert response.status_code == 400, bad
        assert "return_url" in response.json()["errors"]
    assert Charge.objects.count() == 1


def test_the_pay_page_shows_money_and_leads_back_to_the_shop(client):
    charge, _ = charge_create(
        merchant_order_no="383000000000000001",
        amount=500,
        currency="CNY",
        description="Green tea",
        return_url="http://testserver/orders/383000000000000001",
    )
    url = f"/provider/pay/{charge.txn_id}"
    page = client.get(url).content.decode()
    assert (
        '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    )
    assert 'id="amount">¥5.00<' in page and "minor units" not in page
    assert 'id="back-unpaid" href="http://testserver/orders/383000000000000001"' in page
    assert 'id="return"' not in page
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)[1]
    done = client.post(url, {"csrfmiddlewaretoken": token, "action": "confirm"})
    assert done.status_code == 303
    page = client.get(url).content.decode()
    assert 'data-status="SUCCESS"' in page
    assert 'id="return" href="http://testserver/orders/383000000000000001"' in page
    assert 'id="confirm"' not in page
    client.post("/i18n/setlang/", {"language": "zh-hans", "next": url})
    page = client.get(url).content.decode()
    assert 'lang="zh-hans"' in page and "返回商店" in page and "已支付" in page


def test_a_charge_without_a_return_url_has_no_way_back_button(client):
    charge, _ = charge_create(merchant_order_no="n-1", amount=1999, currency="USD")
    charge_settle(txn_id=charge.txn_id, outcome=Charge.Status.FAILED)
    page = client.get(f"/provider/pay/{charge.txn_id}").content.decode()
    assert 'id="amount">$19.99<' in page and "USD" in page
    assert 'id="return"' not in page and "You declined this payment" in page


@pytest.mark.django_db(transaction=True)
def test_the_shops_pay_button_gives_the_provider_the_order_page(
    client, live_server, settings
):
    settings.PAYMENT_PROVIDER_URL = f"{live_server.url}/provider"
    user, _, _ = customer("dave")
    client.force_login(user)
    order = place_order(user, amount=800)
    response = client.post(
        f"/orders/{order.merchant_order_no}/pay", {"method": "provider"}
    )
    assert response.status_code == 303
    assert "/provider/pay/" in response["Location"], messages_of(client.get("/orders"))
    charge = Charge.objects.get()
    assert charge.return_url == f"http://testserver/orders/{order.merchant_order_no}"
    # The API gives the same page (the shop's page of that order).
    api = customer("erin")
    order = place_order(api[0], amount=900)
    paid = api[1].post(
        f"/api/v1/orders/{order.merchant_order_no}/pay",
        {"method": "provider"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k-provider-return-1",
    )
    assert paid.status_code == 201, paid.content
    charge = Charge.objects.get(merchant_order_no=order.merchant_order_no)
    assert charge.return_url == f"http://testserver/orders/{order.merchant_order_no}"


# Odds and ends ------------------------------------------------------------------------


def test_favicon_is_never_a_404(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 301
    assert response["Location"] == "/static/favicon.ico"
    icon = client.get("/static/favicon.ico")
    assert icon.status_code == 200
    assert b"".join(icon.streaming_content)[:4] == b"\x00\x00\x01\x00"
    assert client.get("/static/favicon.svg").status_code == 200


def test_login_lands_on_the_order_list(client):
    user, _, _ = customer("frank")
    user.set_password("pass-word-123")
    user.save()
    response = client.post("/login", {"username": "frank", "password": "pass-word-123"})
    assert response.status_code == 302 and response["Location"] == "/orders"
