"""The web UI through Django's test client (the browser tests drive a real Chromium)."""

import re
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone

from ledger.models import Account, Posting
from orders.models import Order, PreOrder
from orders.services import product_get_or_create, stock_top_up
from payments.models import Payment
from tests.helpers import balance, customer, place_order

pytestmark = pytest.mark.django_db


@pytest.fixture
def shopper(client):
    user, _, wallet = customer("alice", balance=10_000)
    client.force_login(user)
    return user, wallet


def form_token(response) -> str:
    match = re.search(rb'name="token" value="(\d+)"', response.content)
    assert match, response.content[:2000]
    return match.group(1).decode()


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def test_pages_need_a_login(client):
    for url in ("/orders/new", "/orders", "/account", "/orders/1"):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/login?next=")
    assert client.get("/login").status_code == 200


def test_login_and_logout(client):
    customer("bob")
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.get(username="bob")
    user.set_password("s3cret-pass-1")
    user.save()
    response = client.post(
        "/login", {"username": "bob", "password": "s3cret-pass-1"}, follow=True
    )
    assert response.redirect_chain[0] == ("/orders", 302)  # the order list
    assert client.post("/logout").status_code == 302
    assert client.get("/orders").status_code == 302


def new_form(client):
    """GET /orders/new: it issues a token and redirects to the form that names it."""
    response = client.get("/orders/new")
    assert response.status_code == 302
    assert response["Location"].startswith("/orders/new?token=")
    return client.get(response["Location"])


def test_new_order_form_issues_a_one_time_token(client, shopper):
    user, _ = shopper
    response = new_form(client)
    assert response.status_code == 200
    token = form_token(response)
    assert PreOrder.objects.get(merchant_order_no=token).owner == user
    assert "no-store" not in response.get("Cache-Control", "")
    again = client.get(f"/orders/new?token={token}")  # back to that form
    assert form_token(again) == token


def test_the_form_issues_one_pre_order_per_visit_until_it_is_used(client, shopper):
    """Showing the form again (the nav link, a reload, a second tab) reuses the
    visit's unused number; only placing an order with it makes the next form new."""
    user, _ = shopper
    token = form_token(new_form(client))
    for _ in range(3):
        assert form_token(new_form(client)) == token
    assert PreOrder.objects.filter(owner=user).count() == 1
    client.post("/orders/new", {"token": token, "amount": "3", "description": "Tea"})
    fresh = form_token(new_form(client))
    assert fresh != token
    assert form_token(new_form(client)) == fresh
    assert PreOrder.objects.filter(owner=user).count() == 2
    # Another visit (a new session) gets its own number.
    client.logout()
    client.force_login(user)
    assert form_token(new_form(client)) not in (token, fresh)
    # An expired number is not reused.
    PreOrder.objects.filter(owner=user).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    expired = PreOrder.objects.filter(owner=user).order_by("-id").first()
    assert form_token(new_form(client)) != expired.merchant_order_no


def test_form_of_a_placed_order_says_so_and_keeps_its_token(client, shopper):
    token = form_token(new_form(client))
    client.post("/orders/new", {"token": token, "amount": "7.50", "description": "Tea"})
    again = client.get(f"/orders/new?token={token}")
    assert form_token(again) == token
    assert again.context["placed"] == Order.objects.get()
    assert b'value="7.50"' in again.content


def test_a_token_that_is_not_yours_or_expired_is_replaced_on_get(client, shopper):
    user, _ = shopper
    others = PreOrder.objects.create(
        merchant_order_no="41",
        owner=customer("mallory")[0],
        expires_at=timezone.now() + timedelta(hours=1),
    )
    expired = PreOrder.objects.create(
        merchant_order_no="44",
        owner=user,
        expires_at=timezone.now() - timedelta(seconds=1),
    )
    for token in (others.merchant_order_no, expired.merchant_order_no, "zzz"):
        response = client.get(f"/orders/new?token={token}")
        assert response.status_code == 302
        fresh = response["Location"].split("token=")[1]
        assert fresh != token
        assert PreOrder.objects.get(merchant_order_no=fresh).owner == user


def test_post_redirects_303_to_the_order(client, shopper):
    token = form_token(new_form(client))
    response = client.post(
        "/orders/new", {"token": token, "amount": "12.34", "description": "Tea"}
    )
    assert response.status_code == 303
    assert response["Location"] == f"/orders/{token}"
    order = Order.objects.get()
    assert (order.merchant_order_no, order.amount, order.description) == (
        token,
        1234,
        "Tea",
    )
    page = client.get(response["Location"])
    assert "Order placed." in messages_of(page)
    assert b"12.34" in page.content


def test_the_same_form_submitted_again_lands_on_the_same_order(client, shopper):
    token = form_token(new_form(client))
    form = {"token": token, "amount": "5", "description": "Tea"}
    first = client.post("/orders/new", form)
    again = client.post("/orders/new", form)
    assert first.status_code == again.status_code == 303
    assert first["Location"] == again["Location"]
    assert Order.objects.count() == 1 and Order.objects.get().amount == 500
    page = client.get(again["Location"])
    assert "You already placed this order; here it is." in messages_of(page)


@pytest.mark.parametrize(
    "changed", [{"amount": "6"}, {"description": "Coffee"}, {"amount": "5.00"}]
)
def test_a_form_sent_again_with_other_contents_is_offered_on_a_new_form(
    client, shopper, changed
):
    """Two tabs show the same form; or the form was changed after it was sent. The
    second order is neither placed twice nor dropped: it comes back on a new form."""
    token = form_token(new_form(client))
    form = {"token": token, "amount": "5", "description": "Tea"}
    client.get(client.post("/orders/new", form)["Location"])
    second = {**form, **changed}
    shown = client.post("/orders/new", second)
    if changed == {"amount": "5.00"}:  # the same order, written differently
        assert shown.status_code == 303 and shown["Location"] == f"/orders/{token}"
        assert Order.objects.count() == 1
        return
    assert shown.status_code == 200
    assert messages_of(shown) == [
        f"This form already placed order {token}, with other contents; nothing "
        "more was ordered. To order this too, check it and submit it again."
    ]
    fresh = form_token(shown)
    assert fresh != token
    assert shown.context["form"].initial["description"] == second["description"]
    assert Order.objects.count() == 1
    placed = client.post("/orders/new", {**second, "token": fresh})
    assert placed.status_code == 303 and placed["Location"] == f"/orders/{fresh}"
    assert (
        Order.objects.get(merchant_order_no=fresh).description
        == (second["description"])
    )
    assert Order.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_tabs_of_one_form_sent_at_once_place_one_order(on_postgres, client):
    """Six tabs of the same form sent at the same instant, three of them with the
    same contents: one order is placed; the same contents land on it, the others
    come back on new forms, nothing dropped or doubled."""
    from django.test import Client

    from tests.conftest import run_in_threads

    user, _, _ = customer("alice", balance=10_000)
    client.force_login(user)
    token = form_token(new_form(client))
    session = client.cookies["sessionid"].value

    def send(i: int):
        tab = Client()
        tab.cookies["sessionid"] = session
        amount = "5" if i % 2 else str(10 + i)
        return tab.post("/orders/new", {"token": token, "amount": amount})

    answers = run_in_threads(6, send)
    (order,) = Order.objects.all()
    assert order.merchant_order_no == token
    landed = [a for a in answers if a.status_code == 303]
    offered = [a for a in answers if a.status_code == 200]
    assert len(landed) + len(offered) == 6
    assert {a["Location"] for a in landed} == {f"/orders/{token}"}
    # the ones that lost sent other contents than the one placed
    for answer in offered:
        assert answer.context["form"].initial["amount"] * 100 != order.amount
    fresh = {form_token(a) for a in offered}
    assert token not in fresh
    assert PreOrder.objects.filter(merchant_order_no__in=fresh).count() == len(fresh)


@pytest.mark.parametrize(
    "amount",
    # Python reads the last five as numbers (1e5 is ¥100,000); a shopper does not.
    ["", "0", "-1", "abc", "1.234", "NaN", "1e20", "1e5", "1_000", "+5", "١٢", "1e-2"],
)
def test_bad_amount_shows_the_form_again_with_the_same_token(client, shopper, amount):
    token = form_token(new_form(client))
    response = client.post("/orders/new", {"token": token, "amount": amount})
    assert response.status_code == 200
    assert form_token(response) == token
    assert response.context["form"].errors["amount"]
    assert not Order.objects.exists()


@pytest.mark.parametrize("amount", ["-5", "-0.5", "-.5", "0"])
def test_an_amount_below_the_minimum_says_so(client, shopper, amount):
    token = form_token(new_form(client))
    response = client.post("/orders/new", {"token": token, "amount": amount})
    assert response.status_code == 200
    assert response.context["form"].errors["amount"] == [
        "Ensure this value is greater than or equal to 0.01."
    ]
    assert not Order.objects.exists()


def test_a_forged_or_expired_token_gets_a_fresh_form(client, shopper):
    user, _ = shopper
    other = customer("mallory")[0]
    forged = PreOrder.objects.create(
        merchant_order_no="42", owner=other, expires_at=timezone.now()
    )
    expired = PreOrder.objects.create(
        merchant_order_no="43",
        owner=user,
        expires_at=timezone.now() - timedelta(seconds=1),
    )
    for token in (forged.merchant_order_no, expired.merchant_order_no, "x" * 40):
        response = client.post("/orders/new", {"token": token, "amount": "5"})
        assert response.status_code == 200
        fresh = form_token(response)
        assert fresh not in ("42", "43")
        assert PreOrder.objects.get(merchant_order_no=fresh).owner == user
    assert not Order.objects.exists()


def test_pay_button_pays_once_and_says_so_the_second_time(client, shopper):
    user, wallet = shopper
    order = place_order(user, amount=2500)
    url = f"/orders/{order.merchant_order_no}"
    page = client.get(url)
    assert b'id="pay"' in page.content
    first = client.post(f"{url}/pay")
    assert first.status_code == 303 and first["Location"] == url
    page = client.get(url)
    assert "Paid. Thank you!" in messages_of(page)
    assert b'id="pay"' not in page.content
    second = client.post(f"{url}/pay")
    assert second.status_code == 303
    assert "You have already paid this order." in messages_of(client.get(url))
    assert balance(wallet) == 7500
    assert Payment.objects.filter(order=order).count() == 1


@pytest.mark.parametrize("method", ["bank", "PROVIDER", "x" * 300])
def test_pay_with_a_method_the_page_does_not_offer_is_refused(client, shopper, method):
    user, wallet = shopper
    order = place_order(user, amount=2500)
    answer = client.post(f"/orders/{order.merchant_order_no}/pay", {"method": method})
    assert answer.status_code == 400
    assert balance(wallet) == 10_000
    assert not Payment.objects.filter(order=order).exists()


def test_pay_without_enough_money_says_so(client):
    user, _, wallet = customer("poor", balance=100)
    client.force_login(user)
    order = place_order(user, amount=2500)
    client.post(f"/orders/{order.merchant_order_no}/pay")
    page = client.get(f"/orders/{order.merchant_order_no}")
    assert "Your balance is too low to pay this order." in messages_of(page)
    assert balance(wallet) == 100


@pytest.mark.parametrize("status", [Account.Status.FROZEN, Account.Status.CLOSED])
def test_pay_from_a_frozen_or_closed_wallet_says_so(client, shopper, status):
    user, wallet = shopper
    order = place_order(user, amount=2500)
    # (A wallet holding money is closed only in data from before closing asked for
    # an empty account; frozen, it is the usual case.)
    Account.objects.filter(pk=wallet.pk).update(status=status)
    url = f"/orders/{order.merchant_order_no}"
    answer = client.post(f"{url}/pay")
    assert answer.status_code == 303 and answer["Location"] == url
    assert (
        "Your wallet is frozen or closed, so it cannot pay; contact support."
        in messages_of(client.get(url))
    )
    assert balance(wallet) == 10_000
    assert not Payment.objects.filter(status=Payment.Status.SUCCEEDED).exists()
    order.refresh_from_db()
    assert order.status == Order.Status.PENDING_PAYMENT
    assert Account.objects.get(pk=wallet.pk).status != Account.Status.ACTIVE


@pytest.mark.parametrize(
    "url",
    [
        "/orders/{no}%00",
        "/orders/%00",
        "/orders/{no}%00/pay",
        "/orders/{no}%00/cancel",
        "/orders/new?token=%00",
        "/orders/new?token={no}%00",
    ],
)
def test_a_nul_in_the_url_is_not_found(client, shopper, url):
    order = place_order(shopper[0])
    url = url.format(no=order.merchant_order_no)
    method = client.post if url.endswith(("/pay", "/cancel")) else client.get
    answer = method(url)
    assert answer.status_code == 404
    assert answer["Content-Type"].startswith("text/html")
    order.refresh_from_db()
    assert order.status == Order.Status.PENDING_PAYMENT


def test_cancel_from_the_order_page(client, shopper):
    user, _ = shopper
    order = place_order(user)
    url = f"/orders/{order.merchant_order_no}"
    assert client.post(f"{url}/cancel").status_code == 303
    assert messages_of(client.get(url)) == ["Order cancelled."]
    # A second click (or the page resubmitted) is the same cancel: said as a repeat.
    assert client.post(f"{url}/cancel").status_code == 303
    assert messages_of(client.get(url)) == ["This order is already cancelled."]
    client.post(f"{url}/pay")
    assert "This order was cancelled; it cannot be paid." in messages_of(
        client.get(url)
    )


def test_a_paid_order_is_not_cancelled_from_the_order_page(client, shopper):
    from payments.services import payment_pay_with_balance

    user, _ = shopper
    order = place_order(user)
    payment_pay_with_balance(order_id=order.pk)
    url = f"/orders/{order.merchant_order_no}"
    assert client.post(f"{url}/cancel").status_code == 303
    assert messages_of(client.get(url)) == ["Only an unpaid order can be cancelled."]
    assert Order.objects.get(pk=order.pk).status == Order.Status.PAID


def test_someone_elses_order_is_not_found(client, shopper):
    order = place_order(customer("bob")[0])
    url = f"/orders/{order.merchant_order_no}"
    assert client.get(url).status_code == 404
    assert client.post(f"{url}/pay").status_code == 404
    assert client.post(f"{url}/cancel").status_code == 404
    order.refresh_from_db()
    assert order.status == Order.Status.PENDING_PAYMENT


def test_writes_are_post_only(client, shopper):
    order = place_order(shopper[0])
    assert client.get(f"/orders/{order.merchant_order_no}/pay").status_code == 405
    assert client.put("/orders/new").status_code == 405


def test_account_shows_balance_and_entries(client, shopper):
    user, _ = shopper
    order = place_order(user, amount=2500)
    client.post(f"/orders/{order.merchant_order_no}/pay")
    page = client.get("/account")
    assert page.status_code == 200
    assert "¥75.00" in page.content.decode()
    postings = list(page.context["postings"])
    assert [p.amount for p in postings] == [-2500, 10_000]
    assert all(isinstance(p, Posting) for p in postings)


def test_orders_list(client, shopper):
    order = place_order(shopper[0], description="Oolong")
    page = client.get("/orders")
    assert order.merchant_order_no in page.content.decode()
    assert "Oolong" in page.content.decode()
    assert client.get("/").status_code == 302


def test_simplified_chinese(client, shopper):
    response = client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/orders"})
    assert response.status_code == 302
    page = new_form(client).content.decode()
    assert "新订单" in page and 'lang="zh-hans"' in page
    order = place_order(shopper[0])
    page = client.get(f"/orders/{order.merchant_order_no}").content.decode()
    assert "待支付" in page


@pytest.mark.parametrize("button", ["pay", "cancel", "refund"])
def test_a_button_pressed_after_the_session_ended_comes_back_to_the_order(
    client, button
):
    # The shopper logged out in another tab (or the session expired) with the order
    # page open: its CSRF token still holds, so the POST reaches the login check.
    user, _, wallet = customer("carol", balance=10_000)
    user.set_password("carol-pass-1")
    user.save()
    order = place_order(user, amount=2500)
    url = f"/orders/{order.merchant_order_no}"
    answer = client.post(f"{url}/{button}")
    assert answer.status_code == 302
    assert answer["Location"] == f"/login?next={url}"
    login = client.get(answer["Location"])
    assert messages_of(login) == [
        "You were logged out, so nothing was done. Log in and try again."
    ]
    back = client.post(
        "/login", {"username": "carol", "password": "carol-pass-1", "next": url}
    )
    # The order's page, where the button is; never its POST-only URL (a 405).
    assert back["Location"] == url
    assert client.get(url).status_code == 200
    order.refresh_from_db()
    assert order.status == Order.Status.PENDING_PAYMENT
    assert balance(wallet) == 10_000


@pytest.mark.parametrize("method", ["balance", "provider"])
def test_pay_from_a_stale_page_of_an_authorized_order_says_it_is_held(
    client, shopper, settings, method
):
    # The page was opened before the order was authorized (through the API): its
    # Pay buttons are stale, and the order is held, not cancelled.
    from payments.services import payment_authorize_with_balance

    settings.PAYMENT_PROVIDER_URL = "http://127.0.0.1:9/provider"  # never asked
    user, wallet = shopper
    order = place_order(user, amount=2500)
    with transaction.atomic():
        payment_authorize_with_balance(order_id=order.pk, hold_seconds=3600)
    url = f"/orders/{order.merchant_order_no}"
    assert client.post(f"{url}/pay", {"method": method}).status_code == 303
    assert messages_of(client.get(url)) == [
        "This order is already authorized: its amount is held on your wallet until "
        "the shop captures it, so nothing more was charged."
    ]
    order.refresh_from_db()
    assert order.status == Order.Status.AUTHORIZED
    assert balance(wallet) == 10_000
    assert Payment.objects.filter(order=order).count() == 1


def test_pay_short_of_available_money_says_part_is_held(client):
    # The balance covers the order, but an authorized payment holds part of it.
    from payments.services import payment_authorize_with_balance

    user, _, wallet = customer("held", balance=3000)
    client.force_login(user)
    held = place_order(user, amount=2000)
    with transaction.atomic():
        payment_authorize_with_balance(order_id=held.pk, hold_seconds=3600)
    order = place_order(user, amount=2500)
    url = f"/orders/{order.merchant_order_no}"
    client.post(f"{url}/pay")
    assert messages_of(client.get(url)) == [
        "Part of your balance is held by authorized payments; what is left is too "
        "low to pay this order."
    ]
    assert balance(wallet) == 3000


@pytest.mark.django_db(transaction=True)  # the provider is called outside one
def test_a_provider_that_did_not_answer_leaves_nothing_to_wait_for(
    client, shopper, settings
):
    # The payment was opened but the provider never saw it: no pay page exists, so
    # nothing can settle by itself; the page offers the button again instead.
    settings.PAYMENT_PROVIDER_URL = "http://127.0.0.1:9/provider"  # nobody there
    user, _ = shopper
    order = place_order(user, amount=2500)
    url = f"/orders/{order.merchant_order_no}"
    assert client.post(f"{url}/pay", {"method": "provider"})["Location"] == url
    page = client.get(url)
    assert messages_of(page) == ["The payment provider is not answering; try again."]
    assert Payment.objects.get(order=order).status == Payment.Status.PENDING
    assert b'id="waiting"' not in page.content
    assert b'data-following="0"' in page.content
    assert b'id="pay-provider"' in page.content


# The order form sent after the session ended -----------------------------------------


def logged_out_shopper(client, name: str = "dora"):
    """A shopper with a password whose order form is open when the session ends."""
    user = customer(name, balance=10_000)[0]
    user.set_password(f"{name}-pass-1")
    user.save()
    client.force_login(user)
    return user


def log_in_after(client, answer, name: str = "dora"):
    """Follow the login redirect as a browser does: the login page, then its form."""
    assert answer.status_code == 302 and answer["Location"].startswith("/login?")
    nxt = parse_qs(urlsplit(answer["Location"]).query)["next"][0]
    login = client.get(answer["Location"])
    back = client.post(
        "/login", {"username": name, "password": f"{name}-pass-1", "next": nxt}
    )
    assert back.status_code == 302
    return login, back["Location"]


def test_a_form_sent_after_the_session_ended_is_kept_for_after_the_login(client):
    user = logged_out_shopper(client)
    tea = product_get_or_create(sku="TEA", name="Tea", price=1000, currency="CNY")[0]
    stock_top_up(product_id=tea.pk, at_least=5)
    token = form_token(new_form(client))
    client.logout()  # the session expired, or they logged out in another tab
    typed = {
        "token": token,
        "amount": "",
        "description": "For grandma",
        f"quantity_{tea.pk}": "2",
    }
    answer = client.post("/orders/new", typed)
    assert not Order.objects.exists()  # nothing ordered while logged out
    login, back = log_in_after(client, answer)
    assert messages_of(login) == [
        "You were logged out, so nothing was ordered. Log in, then check the form "
        "and place the order again."
    ]
    assert not Order.objects.exists()  # nor by logging in
    assert back == f"/orders/new?token={token}"
    form = client.get(back)
    assert form.status_code == 200 and form_token(form) == token
    html = form.content.decode()
    assert 'value="For grandma"' in html
    assert re.search(rf'name="quantity_{tea.pk}" value="2"', html)
    assert messages_of(form) == [
        "Here is the form as you left it; nothing was ordered yet. Check it and "
        "place the order."
    ]
    assert not Order.objects.exists()
    # Kept once: showing the form again shows it as it is now, not the kept one.
    assert 'value="For grandma"' not in client.get(back).content.decode()
    placed = client.post("/orders/new", typed)  # the button, pressed again
    assert placed.status_code == 303 and placed["Location"] == f"/orders/{token}"
    order = Order.objects.get()
    assert (order.owner, order.amount, order.description) == (
        user,
        2000,
        "For grandma",
    )


def test_a_placed_form_sent_again_after_the_session_ended_orders_once(client):
    logged_out_shopper(client)
    token = form_token(new_form(client))
    typed = {"token": token, "amount": "7.50", "description": "Tea"}
    assert client.post("/orders/new", typed).status_code == 303
    client.logout()
    # Back to the form, and sent again: the login leads back to the same form.
    _, back = log_in_after(client, client.post("/orders/new", typed))
    form = client.get(back)
    assert form_token(form) == token and form.context["placed"] is not None
    again = client.post("/orders/new", typed)
    assert again["Location"] == f"/orders/{token}"
    assert Order.objects.count() == 1
    assert "You already placed this order; here it is." in messages_of(
        client.get(again["Location"])
    )


def test_someone_else_logging_in_does_not_see_the_kept_form(client):
    logged_out_shopper(client)
    token = form_token(new_form(client))
    client.logout()
    answer = client.post(
        "/orders/new", {"token": token, "amount": "9", "description": "Secret gift"}
    )
    logged_out_shopper(Client(), "erin")
    _, back = log_in_after(client, answer, "erin")
    form = client.get(client.get(back)["Location"])  # not erin's token: a new one
    assert form_token(form) != token
    assert "Secret gift" not in form.content.decode()
    assert not Order.objects.exists()


@pytest.mark.parametrize(
    "posted",
    [
        {"amount": "x" * 10_000, "description": "y" * 10_000},
        {"evil": "1", **{f"quantity_{n}": "1" for n in range(999_990, 1_000_090)}},
        {"token": "<script>", "amount": "3"},
        {},
    ],
    ids=["long", "many-lines", "odd-token", "empty"],
)
def test_a_mangled_form_sent_logged_out_comes_back_as_a_plain_form(client, posted):
    logged_out_shopper(client)
    token = form_token(new_form(client))
    client.logout()
    answer = client.post("/orders/new", {"token": token, **posted})
    _, back = log_in_after(client, answer)
    form = client.get(back)
    if form.status_code == 302:  # a token not the shopper's: a new form
        form = client.get(form["Location"])
    assert form.status_code == 200
    html = form.content.decode()
    assert "x" * 256 not in html and "y" * 256 not in html and "evil" not in html
    assert not Order.objects.exists()
    assert len(client.session.get("order_form_draft", {})) == 0
