"""The user-experience layer in a real browser: no click, reload or back button makes
a second order or a second payment."""

import re

import pytest

from ledger.services import customer_get_or_create, ledger_deposit
from orders.models import Order
from payments.models import Payment
from tests.browser.conftest import PASSWORD
from tests.helpers import balance, place_order

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ORDER_URL = re.compile(r".*/orders/\d+$")
FORM_URL = re.compile(r".*/orders/new\?token=\d+$")


@pytest.fixture
def shopper():
    user, _, wallet = customer_get_or_create(
        username="shopper", password=PASSWORD, currency="CNY"
    )
    ledger_deposit(account_id=wallet.pk, amount=50_000, reference="fund:shopper")
    return user, wallet


def open_page(browser, live_server, *, javascript: bool = True, **context):
    """A fresh browser context, logged in through the login form, recording POSTs."""
    ctx = browser.new_context(
        base_url=live_server.url, java_script_enabled=javascript, **context
    )
    ctx.set_default_timeout(10_000)
    page = ctx.new_page()
    page.posts = []
    page.on(
        "request", lambda r: page.posts.append(r.url) if r.method == "POST" else None
    )
    page.goto("/login")
    page.fill("#id_username", "shopper")
    page.fill("#id_password", PASSWORD)
    page.click("#log-in")
    page.wait_for_url(re.compile(r".*/orders$"))  # the order list
    page.goto("/orders/new")
    page.wait_for_url(FORM_URL)
    page.posts.clear()
    return page


def posts_to(page, path: str) -> int:
    return sum(url.endswith(path) for url in page.posts)


def test_double_click_on_submit_creates_one_order(browser, live_server, shopper, shot):
    page = open_page(browser, live_server)
    shot(page, "01-new-order")
    token = page.input_value("input[name=token]")
    page.fill("#id_amount", "88.50")
    page.fill("#id_description", "Oolong tea")
    page.dblclick("#place-order")
    page.wait_for_url(ORDER_URL)
    assert page.url.endswith(f"/orders/{token}")
    assert posts_to(page, "/orders/new") == 1  # the button disabled itself
    assert Order.objects.filter(owner=shopper[0]).count() == 1
    assert Order.objects.get().amount == 8850
    assert page.is_visible("text=Order placed.")
    shot(page, "02-order-placed")
    page.context.close()


def test_double_click_without_javascript_still_creates_one_order(
    browser, live_server, shopper
):
    """No JavaScript, so nothing stops the second submission: the token does."""
    page = open_page(browser, live_server, javascript=False)
    page.fill("#id_amount", "12")
    page.dblclick("#place-order")
    page.wait_for_url(ORDER_URL)
    page.wait_for_load_state("load")
    assert posts_to(page, "/orders/new") >= 1
    assert Order.objects.filter(owner=shopper[0]).count() == 1
    page.context.close()


def test_reload_after_the_post_does_not_resubmit(browser, live_server, shopper, shot):
    page = open_page(browser, live_server)
    page.fill("#id_amount", "20")
    page.click("#place-order")
    page.wait_for_url(ORDER_URL)
    order_url = page.url
    page.reload()
    page.reload()
    assert page.url == order_url
    assert posts_to(page, "/orders/new") == 1  # reloads are GETs (PRG)
    assert Order.objects.filter(owner=shopper[0]).count() == 1
    shot(page, "03-order-after-reload")
    page.context.close()


def test_back_and_resubmit_lands_on_the_same_order(browser, live_server, shopper, shot):
    page = open_page(browser, live_server)
    token = page.input_value("input[name=token]")
    page.fill("#id_amount", "30")
    page.click("#place-order")
    page.wait_for_url(ORDER_URL)
    page.go_back()
    page.wait_for_url(FORM_URL)
    assert page.input_value("input[name=token]") == token  # the same form, same token
    assert page.is_enabled("#place-order")
    if not page.input_value("#id_amount"):
        page.fill("#id_amount", "30")
    page.click("#place-order")
    page.wait_for_url(ORDER_URL)
    assert page.url.endswith(f"/orders/{token}")
    assert posts_to(page, "/orders/new") == 2
    assert Order.objects.filter(owner=shopper[0]).count() == 1
    assert page.is_visible("text=You already placed this order; here it is.")
    shot(page, "04-resubmitted-same-order")
    page.context.close()


def test_pay_clicked_twice_pays_once(browser, live_server, shopper, shot):
    user, wallet = shopper
    order = place_order(user, amount=12_345, description="Coffee beans, 1 kg")
    page = open_page(browser, live_server)
    page.goto(f"/orders/{order.merchant_order_no}")
    stale = page.context.new_page()  # the same order open in a second tab
    stale.goto(f"/orders/{order.merchant_order_no}")
    shot(page, "05-order-pending")
    page.dblclick("#pay")
    page.wait_for_selector("text=Paid. Thank you!")
    assert posts_to(page, "/pay") == 1  # the button disabled itself
    assert balance(wallet) == 50_000 - 12_345
    assert not page.is_visible("#pay")
    shot(page, "06-order-paid")
    # The other tab still shows the button: paying from it is refused, and says so.
    stale.click("#pay")
    stale.wait_for_selector("text=You have already paid this order.")
    shot(stale, "07-already-paid")
    assert balance(wallet) == 50_000 - 12_345
    assert Payment.objects.filter(order=order).count() == 1
    page.goto("/account")
    assert page.inner_text("#balance") == "¥376.55"
    shot(page, "08-account")
    page.goto("/orders")
    shot(page, "09-orders")
    page.context.close()


def test_pay_after_logging_out_in_another_tab_comes_back_to_the_order(
    browser, live_server, shopper, shot
):
    user, wallet = shopper
    order = place_order(user, amount=2_500)
    page = open_page(browser, live_server)
    page.goto(f"/orders/{order.merchant_order_no}")
    other = page.context.new_page()  # logging out keeps the CSRF cookie
    other.goto("/orders")
    other.click("text=Log out")
    other.wait_for_url(re.compile(r".*/login$"))
    page.click("#pay")
    page.wait_for_selector("text=You were logged out, so nothing was done.")
    shot(page, "05b-logged-out-pay")
    page.fill("#id_username", "shopper")
    page.fill("#id_password", PASSWORD)
    page.click("#log-in")
    # Back on the order's page (never a 405 at the button's POST-only URL).
    page.wait_for_url(re.compile(rf".*/orders/{order.merchant_order_no}$"))
    assert page.is_visible("#pay")
    assert balance(wallet) == 50_000
    page.click("#pay")
    page.wait_for_selector("text=Paid. Thank you!")
    assert balance(wallet) == 50_000 - 2_500
    page.context.close()


def test_chinese_on_a_phone(browser, live_server, shopper, shot):
    order = place_order(shopper[0], amount=990, description="绿茶")
    page = open_page(
        browser,
        live_server,
        viewport={"width": 390, "height": 844},
        device_scale_factor=2,
        is_mobile=True,
    )
    page.select_option("#language", "zh-hans")
    page.wait_for_selector("text=新订单")
    assert page.is_visible("text=提交订单")
    shot(page, "10-zh-new-order-phone")
    page.goto(f"/orders/{order.merchant_order_no}")
    assert page.is_visible("text=待支付")
    shot(page, "11-zh-order-phone")
    page.context.close()


def test_login_page(browser, live_server, shot):
    ctx = browser.new_context(base_url=live_server.url)
    page = ctx.new_page()
    page.goto("/orders/new")
    page.wait_for_url("**/login?next=/orders/new")
    shot(page, "00-login")
    ctx.close()
