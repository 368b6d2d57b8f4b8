# ruff: noqa: RUF001 - the Chinese pages' punctuation is full-width
"""The shopper's whole visit in a real Chromium, on a desktop (1280 px) and a phone
(390 px), in English and Simplified Chinese: log in, place an order, pay it on the
provider's pay page and come back, watch the order page settle by itself, ask for
a refund (twice, and from a stale tab), read the receipt, the payment history and
the account. Every page is photographed (test-artifacts/screenshots/shop-*) and
must fit the phone's width."""

import re

import pytest
from django.db import transaction

from ledger.services import customer_get_or_create, ledger_deposit
from orders.models import Order, PreOrder
from payments.models import Payment, ProviderEvent, Refund
from payments.provider.models import Notification
from payments.provider.services import notification_deliver
from payments.services import payment_pay_with_balance, provider_event_process
from tests.browser.conftest import PASSWORD
from tests.helpers import balance, place_order

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ORDER_URL = re.compile(r".*/orders/\d+$")
FORM_URL = re.compile(r".*/orders/new\?token=\d+$")
PAY_PAGE = re.compile(r".*/provider/pay/P[0-9a-f]+$")

# (width, language): every page at each.
VISITS = [
    pytest.param(1280, "en", id="desktop-en"),
    pytest.param(390, "en", id="phone-en"),
    pytest.param(1280, "zh-hans", id="desktop-zh"),
    pytest.param(390, "zh-hans", id="phone-zh"),
]

WORDS = {
    "en": {
        "orders": "Your orders",
        "paid": "Payment received. Thank you!",
        "refunded": "Refunded: the money goes back through the payment provider.",
        "already": "This payment was already refunded.",
        "receipt": "Receipt",
        "history": "Payment history",
        "top_up": "Top-up",
        "order": "Order {}",
    },
    "zh-hans": {
        "orders": "我的订单",
        "paid": "已收到付款，谢谢！",
        "refunded": "已退款：款项将通过第三方支付原路退回。",
        "already": "这笔支付已经退款。",
        "receipt": "收据",
        "history": "支付记录",
        "top_up": "钱包充值",
        "order": "订单 {}",
    },
}


@pytest.fixture
def shop(live_server, settings):
    """The live server is also the provider: its charge API and its callbacks."""
    settings.PAYMENT_PROVIDER_URL = f"{live_server.url}/provider"
    settings.PROVIDER_CALLBACK_URL = f"{live_server.url}/api/v1/payments/callback"
    user, _, wallet = customer_get_or_create(
        username="shopper", password=PASSWORD, currency="CNY"
    )
    ledger_deposit(
        account_id=wallet.pk,
        amount=50_000,
        reference="fund:shopper",
        description="Top-up",  # an older row's English text: read in any language
    )
    return live_server, user, wallet


def fits(page, width: int) -> None:
    """No page is wider than the screen: nothing scrolls sideways."""
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= width, f"{page.url} is {scroll} px wide on a {width} px screen"


def visit(browser, live_server, width: int, language: str):
    ctx = browser.new_context(
        base_url=live_server.url,
        viewport={"width": width, "height": 900 if width > 600 else 844},
        device_scale_factor=1 if width > 600 else 2,
        is_mobile=width < 600,
        locale="en-US",
    )
    ctx.set_default_timeout(15_000)
    page = ctx.new_page()
    page.posts = []
    page.on(
        "request", lambda r: page.posts.append(r.url) if r.method == "POST" else None
    )
    return page


@pytest.mark.parametrize(("width", "language"), VISITS)
def test_a_shoppers_visit(browser, shop, shot, width, language):
    live_server, user, wallet = shop
    words = WORDS[language]
    name = f"shop-{width}-{language}"

    def snap(page, step: str) -> None:
        fits(page, width)
        shot(page, f"{name}-{step}")

    # Enough orders for a second page.
    older = [
        place_order(user, amount=100 + n, description=f"Tea #{n}") for n in range(21)
    ]
    page = visit(browser, live_server, width, language)
    page.goto("/login")
    if language != "en":
        page.select_option("#language", language)
        page.wait_for_selector("html[lang=zh-hans]")
    snap(page, "01-login")
    page.fill("#id_username", "shopper")
    page.fill("#id_password", PASSWORD)
    page.click("#log-in")
    page.wait_for_url(re.compile(r".*/orders$"))  # the list, not a new form
    assert page.is_visible(f"text={words['orders']}")
    assert page.is_visible("#page-older")
    snap(page, "02-orders")
    page.click("#page-older")
    page.wait_for_url(re.compile(r".*/orders\?before=\d+$"))
    assert page.locator(".order-row").count() == 1
    assert page.is_visible(f"text={older[0].merchant_order_no}")
    snap(page, "03-orders-older")

    # The form, shown three times, issues one pre-order.
    issued = PreOrder.objects.filter(owner=user).count()
    page.goto("/orders/new")
    page.wait_for_url(FORM_URL)
    token = page.input_value("input[name=token]")
    page.reload()
    page.goto("/orders/new")
    page.wait_for_url(FORM_URL)
    assert page.input_value("input[name=token]") == token
    assert PreOrder.objects.filter(owner=user).count() == issued + 1
    page.fill("#id_amount", "5")
    page.fill("#id_description", "绿茶 Green tea" if language != "en" else "Green tea")
    snap(page, "04-new-order")
    page.click("#place-order")
    page.wait_for_url(ORDER_URL)
    assert page.url.endswith(f"/orders/{token}")
    number_box = page.locator("h1.order-no").bounding_box()
    assert number_box and number_box["height"] < 40  # one line, never wrapped
    snap(page, "05-order")

    # To the provider's pay page, and back.
    page.click("#pay-provider")
    page.wait_for_url(PAY_PAGE)
    assert page.inner_text("#amount") == "¥5.00"
    snap(page, "06-pay-page")
    page.click("#confirm")
    page.wait_for_selector("#status[data-status=SUCCESS]")
    snap(page, "07-pay-page-confirmed")
    page.click("#return")
    page.wait_for_url(ORDER_URL)
    assert page.url.endswith(f"/orders/{token}")
    assert page.is_visible("#waiting")  # pending: the page follows it
    assert not page.is_visible("#pay-provider")  # the open charge is continued
    assert page.is_visible("#continue-pay")
    snap(page, "08-order-waiting")

    # The provider tells the shop and the worker settles it; the page follows
    # without a reload (the marker set on this document survives).
    page.evaluate("window.__sameDocument = true")
    order = Order.objects.get(owner=user, merchant_order_no=token)
    payment = Payment.objects.get(order=order)
    note = Notification.objects.get(charge__merchant_order_no=token)
    assert notification_deliver(notification_id=note.pk)  # the provider's worker
    with transaction.atomic(durable=True):  # our worker
        provider_event_process(event_id=ProviderEvent.objects.get(payment=payment).pk)
    page.wait_for_selector("#order-status[data-status=paid]", timeout=10_000)
    assert page.evaluate("window.__sameDocument === true")
    assert page.is_visible(f"text={words['paid']}")
    for gone in ("#pay", "#pay-provider", "#continue-pay", "#waiting"):
        assert not page.is_visible(gone), gone
    snap(page, "09-order-paid-by-itself")

    # A refund, asked for twice, and again from a tab opened before it: one refund.
    stale = page.context.new_page()
    stale.goto(f"/orders/{token}")
    page.dblclick("#refund")
    page.wait_for_selector(f"text={words['refunded']}")
    assert sum(url.endswith("/refund") for url in page.posts) == 1
    assert not page.is_visible("#refund")
    snap(page, "10-order-refunded")
    stale.click("#refund")
    stale.wait_for_selector(f"text={words['already']}")
    snap(stale, "11-refund-from-a-stale-tab")
    stale.close()
    assert Refund.objects.filter(payment=payment).count() == 1
    # A provider payment's money goes back out through the provider.
    assert balance(wallet) == 50_000

    # The receipt, the history, the account.
    page.goto("/account/payments")
    assert page.is_visible(f"h1:has-text('{words['history']}')")
    snap(page, "12-payments")
    page.click(f"a[href='/account/payments/{payment.pk}']")
    page.wait_for_url(re.compile(rf".*/account/payments/{payment.pk}$"))
    assert page.is_visible(f"text={words['receipt']}")
    assert page.is_visible("#receipt-refund")
    snap(page, "13-receipt")
    page.goto("/account")
    assert page.is_visible(f"text={words['top_up']}")
    snap(page, "14-account")
    assert page.request.get("/favicon.ico").status == 200
    page.context.close()


def test_entries_link_to_their_orders_in_chinese_on_a_phone(browser, shop, shot):
    live_server, user, _ = shop
    orders = [place_order(user, amount=100 + n) for n in range(21)]
    for order in orders:
        with transaction.atomic(durable=True):
            payment_pay_with_balance(order_id=order.pk)
    page = visit(browser, live_server, 390, "zh-hans")
    page.goto("/login")
    page.select_option("#language", "zh-hans")
    page.wait_for_selector("html[lang=zh-hans]")
    page.fill("#id_username", "shopper")
    page.fill("#id_password", PASSWORD)
    page.click("#log-in")
    page.wait_for_url(re.compile(r".*/orders$"))
    page.goto("/account")
    newest = orders[-1].merchant_order_no
    link = page.locator(f"a.entry-order[href='/orders/{newest}']")
    assert link.inner_text() == f"订单 {newest}"
    fits(page, 390)
    shot(page, "shop-390-zh-hans-15-account-entries")
    page.click("#page-older")
    page.wait_for_url(re.compile(r".*/account\?before=\d+$"))
    assert page.locator(".entry").count() == 2  # 21 payments and the deposit
    assert page.is_visible("text=钱包充值")
    fits(page, 390)
    shot(page, "shop-390-zh-hans-16-account-older")
    link = page.locator("a.entry-order").first
    link.click()
    page.wait_for_url(ORDER_URL)
    assert page.is_visible("#order-status[data-status=paid]")
    page.context.close()
