import uuid

import pytest

from orders.models import Order
from orders.services import order_ship
from payments.services import payment_pay_with_balance
from tests.helpers import customer, place_order

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(admin_client):
    return admin_client


def test_order_admin_lists_filters_and_searches(staff):
    user, _, _ = customer("alice", balance=10_000)
    order = place_order(user, description="Jasmine")
    page = staff.get("/admin/orders/order/?status__exact=10&q=Jasmine")
    assert page.status_code == 200
    content = page.content.decode()
    assert order.merchant_order_no in content
    assert "cancel, pay" in content  # available transitions
    assert staff.get(f"/admin/orders/order/{order.pk}/change/").status_code == 200
    assert staff.get("/admin/orders/preorder/").status_code == 200
    assert staff.get("/admin/payments/payment/").status_code == 200


def test_admin_actions_take_only_legal_transitions(staff):
    user, _, _ = customer("alice", balance=10_000)
    pending, paid = place_order(user), place_order(user)
    payment_pay_with_balance(order_id=paid.pk)
    response = staff.post(
        "/admin/orders/order/",
        {"action": "ship", "_selected_action": [pending.pk, paid.pk]},
        follow=True,
    )
    assert response.status_code == 200
    pending.refresh_from_db()
    paid.refresh_from_db()
    assert pending.status == Order.Status.PENDING_PAYMENT  # refused, with a warning
    assert paid.status == Order.Status.SHIPPED
    messages = [str(m) for m in response.context["messages"]]
    assert (
        f"Order {pending.merchant_order_no} is Pending payment; it cannot be "
        "shipped. Not changed."
    ) in messages, messages
    staff.post(
        "/admin/orders/order/",
        {"action": "cancel", "_selected_action": [pending.pk, paid.pk]},
    )
    pending.refresh_from_db()
    paid.refresh_from_db()
    assert (pending.status, paid.status) == (
        Order.Status.CANCELLED,
        Order.Status.SHIPPED,
    )


def test_payments_are_read_only_in_the_admin(staff):
    user, _, _ = customer("alice", balance=10_000)
    payment = payment_pay_with_balance(order_id=place_order(user).pk)
    url = f"/admin/payments/payment/{payment.pk}/change/"
    assert staff.get(url).status_code == 200
    assert b'name="_save"' not in staff.get(url).content


def test_products_are_listed_with_stock_that_only_movements_change(staff):
    from orders.models import Product, StockMovement
    from orders.services import product_get_or_create, stock_top_up

    tea, _ = product_get_or_create(sku="TEA", name="Tea", price=100, currency="CNY")
    stock_top_up(product_id=tea.pk, at_least=5)
    listing = staff.get("/admin/orders/product/")
    assert listing.status_code == 200 and "TEA" in listing.content.decode()
    # the stock field is read-only: a posted stock is ignored
    change = f"/admin/orders/product/{tea.pk}/change/"
    assert staff.get(change).status_code == 200
    staff.post(
        change, {"name": "Green tea", "price": "1.00", "currency": "CNY", "stock": 99}
    )
    tea.refresh_from_db()
    assert (tea.name, tea.stock) == ("Green tea", 5)
    assert staff.get("/admin/orders/stockmovement/").status_code == 200

    url = f"/admin/orders/product/{tea.pk}/adjust-stock/"
    token = staff.get(url, follow=True).context["form"].initial["token"]
    form = {"token": str(token), "quantity": "-2", "note": "broken in the warehouse"}
    first = staff.post(url, form)
    again = staff.post(url, form)  # the second click
    assert first.status_code == again.status_code == 302
    tea.refresh_from_db()
    assert tea.stock == 3
    assert StockMovement.objects.filter(kind="adjustment").count() == 1
    # more than there is, or 0, or a token that is not one, or one the server did
    # not issue (a second adjustment, under a token made up): refused, nothing moves
    fresh = staff.get(url, follow=True).context["form"].initial["token"]
    for bad in (
        {**form, "token": fresh, "quantity": "-4"},
        {**form, "token": fresh, "quantity": "0"},
        {**form, "token": "not-a-token"},
        {**form, "token": uuid.uuid4().hex},
        {**form, "token": fresh[:-1] + ("0" if fresh[-1] != "0" else "1")},
    ):
        response = staff.post(url, bad)
        assert response.status_code == 400 and response.context["form"].errors
    assert Product.objects.get(pk=tea.pk).stock == 3
    # a new product starts with no stock whatever is posted
    staff.post(
        "/admin/orders/product/add/",
        {"sku": "MUG", "name": "Mug", "price": "4.50", "currency": "CNY", "stock": 7},
    )
    assert Product.objects.get(sku="MUG").stock == 0


def test_an_order_page_has_no_save_and_a_posted_one_changes_nothing(staff):
    user, _, _ = customer("alice", balance=10_000)
    order = place_order(user)
    url = f"/admin/orders/order/{order.pk}/change/"
    assert b'name="_save"' not in staff.get(url).content
    # (A Save racing the order's payment answered 500: ConcurrentTransition.)
    assert staff.post(url, {"description": "edited", "_save": "1"}).status_code == 403
    payment_pay_with_balance(order_id=order.pk)
    assert staff.post(url, {"description": "edited", "_save": "1"}).status_code == 403
    order.refresh_from_db()
    assert order.status == Order.Status.PAID and order.description != "edited"


def test_a_stock_adjustment_by_a_long_named_staff_member_keeps_the_reason(client):
    from django.contrib.auth import get_user_model

    from orders.models import StockMovement
    from orders.services import product_get_or_create

    long_name = "s" * 150  # as long as a username may be
    staffer = get_user_model().objects.create_superuser(long_name, password="x")
    client.force_login(staffer)
    tea, _ = product_get_or_create(sku="TEA", name="Tea", price=100, currency="CNY")
    url = f"/admin/orders/product/{tea.pk}/adjust-stock/"
    token = client.get(url, follow=True).context["form"].initial["token"]
    reason = "r" * 200  # as long as the form takes
    answer = client.post(url, {"token": str(token), "quantity": "3", "note": reason})
    assert answer.status_code == 302  # (a 500 before: the note overflowed its column)
    note = StockMovement.objects.get(kind="adjustment").note
    assert note.endswith(f": {reason}") and note.startswith("s")


def adjust_page(client, url: str):
    """Open Adjust stock as the product page's button does (following where it
    leads); return the page and the address the browser then shows."""
    page = client.get(url, follow=True)
    assert page.status_code == 200
    shown = page.redirect_chain[-1][0] if page.redirect_chain else url
    return page, shown


def test_an_adjustment_resubmitted_after_back_is_applied_once(staff):
    from orders.models import Product, StockMovement
    from orders.services import product_get_or_create, stock_top_up

    tea, _ = product_get_or_create(sku="TEA", name="Tea", price=100, currency="CNY")
    stock_top_up(product_id=tea.pk, at_least=5)
    url = f"/admin/orders/product/{tea.pk}/adjust-stock/"
    page, shown = adjust_page(staff, url)
    token = page.context["form"].initial["token"]
    form = {"token": token, "quantity": "5", "note": "delivery"}
    assert staff.post(shown, form).status_code == 302
    # Back: the browser asks for the page at the address it showed, and submits it
    back = staff.get(shown)
    assert back.status_code == 200
    assert back.context["form"].initial["token"] == token
    form["token"] = back.context["form"].initial["token"]
    again = staff.post(shown, form, follow=True)
    assert "This adjustment was already made; nothing changed." in [
        str(m) for m in again.context["messages"]
    ]
    assert Product.objects.get(pk=tea.pk).stock == 10  # 5 + 5, once
    assert StockMovement.objects.filter(kind="adjustment").count() == 1
    # The product page's button starts another adjustment, under another token
    other, _ = adjust_page(staff, url)
    assert other.context["form"].initial["token"] != token


def test_an_adjustment_changed_after_back_says_it_was_not_made(staff):
    """Back, another quantity, submit: the form's token made its adjustment
    already, so nothing more moves, and staff are told the new one was not made
    (not that it "was already made", which it was not)."""
    from orders.models import Product, StockMovement
    from orders.services import product_get_or_create, stock_top_up

    tea, _ = product_get_or_create(sku="TEA", name="Tea", price=100, currency="CNY")
    stock_top_up(product_id=tea.pk, at_least=5)
    page, shown = adjust_page(staff, f"/admin/orders/product/{tea.pk}/adjust-stock/")
    form = {"token": page.context["form"].initial["token"], "note": "delivery"}
    assert staff.post(shown, {**form, "quantity": "5"}).status_code == 302
    again = staff.post(shown, {**form, "quantity": "-3"}, follow=True)
    said = [str(m) for m in again.context["messages"]]
    assert "This adjustment was already made; nothing changed." not in said
    assert (
        "This form already made another adjustment; nothing more changed. Open "
        "the page again to make this one." in said
    )
    assert Product.objects.get(pk=tea.pk).stock == 10  # 5 + 5, once
    assert StockMovement.objects.filter(kind="adjustment").count() == 1


def test_an_adjust_stock_address_with_a_damaged_token_gets_a_fresh_one(staff):
    from orders.services import product_get_or_create

    tea, _ = product_get_or_create(sku="TEA", name="Tea", price=100, currency="CNY")
    url = f"/admin/orders/product/{tea.pk}/adjust-stock/"
    for token in ("not-a-token", "0" * 32):
        response = staff.get(f"{url}?token={token}")
        assert response.status_code == 303
        assert response["Location"].startswith(f"{url}?token=")
        assert token not in response["Location"]


def test_staff_type_prices_as_the_shop_shows_them(staff):
    from orders.models import Product

    add = "/admin/orders/product/add/"
    mug = {"sku": "MUG", "name": "Mug", "price": "12.50", "currency": "CNY"}
    assert staff.post(add, mug).status_code == 302
    assert Product.objects.get(sku="MUG").price == 1250
    assert "¥12.50" in staff.get("/admin/orders/product/").content.decode()
    change = f"/admin/orders/product/{Product.objects.get(sku='MUG').pk}/change/"
    assert 'value="12.50"' in staff.get(change).content.decode()
    for price in ("0", "-1", "12.345", "1e30", "10000000000000.01", "tea", ""):
        response = staff.post(add, {**mug, "sku": "BAD", "price": price})
        assert response.status_code == 200, price
        assert "price" in response.context["adminform"].form.errors, price
        response = staff.post(change, {**mug, "price": price})
        assert response.status_code == 200, price
    assert not Product.objects.filter(sku="BAD").exists()
    assert Product.objects.get(sku="MUG").price == 1250


def test_the_largest_price_is_typed_and_kept(staff):
    """Up to the API's largest amount, to the fen: a product priced there (as
    `create_product` may make one) can be saved again, renamed."""
    from ledger.fields import MAX_AMOUNT
    from orders.models import Product
    from orders.services import product_get_or_create

    largest = f"{MAX_AMOUNT // 100}.{MAX_AMOUNT % 100:02d}"
    mug = {"sku": "MUG", "name": "Mug", "price": largest, "currency": "CNY"}
    assert staff.post("/admin/orders/product/add/", mug).status_code == 302
    assert Product.objects.get(sku="MUG").price == MAX_AMOUNT
    tea, _ = product_get_or_create(
        sku="TEA", name="Tea", price=MAX_AMOUNT, currency="CNY"
    )
    change = f"/admin/orders/product/{tea.pk}/change/"
    assert f'value="{largest}"' in staff.get(change).content.decode()
    renamed = {"name": "Green tea", "price": largest, "currency": "CNY"}
    assert staff.post(change, renamed).status_code == 302
    tea.refresh_from_db()
    assert (tea.name, tea.price) == ("Green tea", MAX_AMOUNT)


def test_a_product_save_writes_only_what_its_form_edits(staff):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from orders.services import product_get_or_create, stock_top_up

    tea, _ = product_get_or_create(sku="TEA", name="Tea", price=100, currency="CNY")
    stock_top_up(product_id=tea.pk, at_least=5)
    change = f"/admin/orders/product/{tea.pk}/change/"
    with CaptureQueriesContext(connection) as queries:
        staff.post(change, {"name": "Green tea", "price": "1.20", "currency": "CNY"})
    updates = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith('UPDATE "orders_product"')
    ]
    # The stock the page read is never written back: a movement committed
    # meanwhile (an order, a cancellation) would be undone.
    assert len(updates) == 1 and '"stock"' not in updates[0], updates
    tea.refresh_from_db()
    assert (tea.name, tea.price, tea.stock) == ("Green tea", 120, 5)


@pytest.mark.django_db(transaction=True)
def test_product_saves_racing_stock_movements_lose_none_of_them(admin_user):
    from django.test import Client

    from ledger.invariants import ledger_report
    from orders.models import Product
    from orders.services import product_get_or_create, stock_adjust, stock_top_up
    from tests.conftest import run_in_threads

    tea, _ = product_get_or_create(sku="TEA", name="Tea", price=100, currency="CNY")
    stock_top_up(product_id=tea.pk, at_least=1000)
    change = f"/admin/orders/product/{tea.pk}/change/"

    def work(i: int) -> None:
        if i % 2:
            client = Client()
            client.force_login(admin_user)
            for n in range(5):
                form = {"name": f"Tea {i}.{n}", "price": "1.00", "currency": "CNY"}
                assert client.post(change, form).status_code == 302
        else:
            for n in range(5):
                stock_adjust(product_id=tea.pk, quantity=-1, reference=f"r{i}.{n}")

    assert run_in_threads(6, work) == [None] * 6
    assert Product.objects.get(pk=tea.pk).stock == 1000 - 15
    report = ledger_report()
    assert report["ok"], report["violations"]


def test_an_order_page_shows_its_items_and_its_payments(staff):
    from orders.services import (
        order_create,
        preorder_create,
        product_get_or_create,
        stock_top_up,
    )

    user, _, _ = customer("alice", balance=10_000)
    tea, _ = product_get_or_create(sku="TEA-9", name="Tea", price=100, currency="CNY")
    stock_top_up(product_id=tea.pk, at_least=5)
    number = preorder_create(owner=user).merchant_order_no
    order = order_create(owner=user, merchant_order_no=number, items=[("TEA-9", 2)])
    payment_pay_with_balance(order_id=order.pk)
    page = staff.get(f"/admin/orders/order/{order.pk}/change/").content.decode()
    assert "TEA-9" in page and "order items" in page.lower()
    assert "payments" in page.lower()


@pytest.mark.django_db(transaction=True)
def test_cancels_pressed_at_once_on_paid_orders_each_say_not_changed(
    admin_user, on_postgres
):
    """Eight staff press Cancel on the same twenty paid orders at the same instant:
    every refusal re-reads the order's status in a thread of one process, as the
    server's threads do. Each press answers its page, saying each order was not
    changed, and goes through the whole selection (it was a 500: django-fsm switched
    the status field's protection off and on for everyone at once)."""
    from django.test import Client

    from tests.backoffice import messages_of
    from tests.conftest import run_in_threads

    user, _, _ = customer("alice", balance=100_000)
    orders = [place_order(user) for _ in range(20)]
    for order in orders:
        payment_pay_with_balance(order_id=order.pk)
    ids = [order.pk for order in orders]

    def press(i: int):
        client = Client(raise_request_exception=False)
        client.force_login(admin_user)
        return client.post(
            "/admin/orders/order/",
            {"action": "cancel", "_selected_action": ids},
            follow=True,
        )

    pages = run_in_threads(8, press)
    assert [getattr(p, "status_code", p) for p in pages] == [200] * 8
    for page in pages:
        said = messages_of(page)
        refused = [m for m in said if m.endswith("Not changed.")]
        assert len(refused) == 20, said
    statuses = set(Order.objects.filter(pk__in=ids).values_list("status", flat=True))
    assert statuses == {Order.Status.PAID}


def test_a_refreshed_order_reads_its_new_status_and_stays_protected():
    user, _, _ = customer("alice", balance=10_000)
    order = place_order(user)
    seen = Order.objects.get(pk=order.pk)
    payment_pay_with_balance(order_id=order.pk)
    seen.refresh_from_db()
    assert seen.status == Order.Status.PAID
    deferred = Order.objects.defer("status").get(pk=order.pk)
    assert deferred.status == Order.Status.PAID  # a deferred status loads too
    for refreshed in (seen, deferred):
        with pytest.raises(AttributeError, match="Direct status modification"):
            refreshed.status = Order.Status.CANCELLED
    gone = place_order(user)
    Order.objects.filter(pk=gone.pk).delete()
    with pytest.raises(Order.DoesNotExist):
        gone.refresh_from_db()
    assert gone.status == Order.Status.PENDING_PAYMENT  # what it held: the row is gone


def test_a_refresh_of_other_fields_keeps_the_status_it_holds():
    """Refreshing some fields, or loading a deferred one, reads those only: the
    status held stays what it was (and the next save is conditional on it)."""
    user, _, _ = customer("alice", balance=10_000)
    order = place_order(user, description="Tea")
    held = Order.objects.get(pk=order.pk)
    partial = Order.objects.only("id", "status").get(pk=order.pk)
    payment_pay_with_balance(order_id=order.pk)
    Order.objects.filter(pk=order.pk).update(description="Green tea")
    held.refresh_from_db(fields=["description"])
    assert (held.description, held.status) == (
        "Green tea",
        Order.Status.PENDING_PAYMENT,
    )
    assert partial.description == "Green tea"  # a deferred field loads
    assert partial.status == Order.Status.PENDING_PAYMENT
    held.refresh_from_db(fields=["status", "description"])
    assert held.status == Order.Status.PAID
    with pytest.raises(AttributeError, match="Direct status modification"):
        held.status = Order.Status.CANCELLED


def test_staff_who_may_only_look_at_orders_can_press_nothing(client):
    """Cancel, ship and complete change the order (a cancel of an authorized one
    releases its hold): staff with only "view order" are offered none of them, and
    posting one changes nothing."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    user, _, _ = customer("alice", balance=10_000)
    pending, paid, shipped = place_order(user), place_order(user), place_order(user)
    payment_pay_with_balance(order_id=paid.pk)
    payment_pay_with_balance(order_id=shipped.pk)
    order_ship(order_id=shipped.pk)
    before = {o.pk: Order.objects.get(pk=o.pk).status for o in (pending, paid, shipped)}
    looker = get_user_model().objects.create_user("looker", is_staff=True)
    looker.user_permissions.add(Permission.objects.get(codename="view_order"))
    client.force_login(looker)
    listing = client.get("/admin/orders/order/")
    assert listing.status_code == 200
    for action in ("cancel", "ship", "complete"):
        assert f'value="{action}"' not in listing.content.decode(), action
        answer = client.post(
            "/admin/orders/order/",
            {"action": action, "_selected_action": list(before)},
            follow=True,
        )
        assert answer.status_code in (200, 403), action
        after = dict(Order.objects.filter(pk__in=before).values_list("pk", "status"))
        assert after == before, action
    # Allowed to change orders: the actions are offered and work.
    looker.user_permissions.add(Permission.objects.get(codename="change_order"))
    client.force_login(get_user_model().objects.get(pk=looker.pk))
    listing = client.get("/admin/orders/order/").content.decode()
    assert all(f'value="{a}"' in listing for a in ("cancel", "ship", "complete"))
    client.post(
        "/admin/orders/order/", {"action": "cancel", "_selected_action": [pending.pk]}
    )
    assert Order.objects.get(pk=pending.pk).status == Order.Status.CANCELLED


def test_a_pre_order_cannot_be_deleted_in_the_admin(staff):
    """A pre-order is the memory that its number was issued, and of the order
    placed with it: deleted, the web form's resubmission would place the order a
    second time. Only the purge task deletes pre-orders (unused, expired ones)."""
    from orders.models import PreOrder

    user, _, _ = customer("alice", balance=10_000)
    order = place_order(user)
    preorder = PreOrder.objects.get(merchant_order_no=order.merchant_order_no)
    listing = staff.get("/admin/orders/preorder/")
    assert listing.status_code == 200
    assert 'value="delete_selected"' not in listing.content.decode()
    staff.post(
        "/admin/orders/preorder/",
        {"action": "delete_selected", "_selected_action": [preorder.pk], "post": "yes"},
    )
    delete = f"/admin/orders/preorder/{preorder.pk}/delete/"
    assert staff.get(delete).status_code == 403
    assert staff.post(delete, {"post": "yes"}).status_code == 403
    page = staff.get(f"/admin/orders/preorder/{preorder.pk}/change/")
    assert page.status_code == 200
    assert b'name="_save"' not in page.content and b"deletelink" not in page.content
    assert PreOrder.objects.filter(pk=preorder.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_a_product_added_twice_at_once_is_added_once(admin_user):
    """A double click on Save of the add form (or two staff members adding the same
    SKU at the same instant): one product, and the other press is told the SKU is
    taken, never a 500."""
    from django.test import Client

    from orders.models import Product
    from tests.conftest import run_in_threads

    form = {"sku": "TEA-1", "name": "Green tea", "price": "12.80", "currency": "CNY"}

    def work(i: int) -> int:
        client = Client()
        client.force_login(admin_user)
        return client.post("/admin/orders/product/add/", form).status_code

    results = run_in_threads(6, work)
    assert sorted(results) == [200] * 5 + [302], results
    assert Product.objects.filter(sku="TEA-1").count() == 1


def test_an_action_refuses_a_selection_larger_than_it_may_act_on(staff, monkeypatch):
    # "Select all" hands the action every row the filters leave: past the limit the
    # action is refused whole (not cut short by the server's timeout halfway).
    from ledger.adminsite import SiteAdmin
    from tests.backoffice import messages_of

    monkeypatch.setattr(SiteAdmin, "action_rows_max", 3)
    user, _, _ = customer("alice", balance=10_000)
    orders = [place_order(user) for _ in range(4)]
    ids = [order.pk for order in orders]
    statuses = Order.objects.filter(pk__in=ids).values_list("status", flat=True)
    for selection in (
        {"select_across": "1", "_selected_action": ids[:1]},
        {"select_across": "0", "_selected_action": ids},
    ):
        page = staff.post(
            "/admin/orders/order/", {"action": "cancel", **selection}, follow=True
        )
        assert page.status_code == 200
        assert messages_of(page) == [
            "4 rows are selected; an action acts on at most 3 at a time. Nothing "
            "was done: narrow the list with its filters, or select fewer rows."
        ]
        assert set(statuses) == {Order.Status.PENDING_PAYMENT}
    # The list's filters narrow "select all" to what the action may take.
    page = staff.post(
        "/admin/orders/order/?q=" + user.username,
        {"action": "cancel", "select_across": "1", "_selected_action": ids[:1]},
        follow=True,
    )
    assert "4 rows are selected" in " ".join(messages_of(page))
    page = staff.post(
        f"/admin/orders/order/?id__in={ids[1]},{ids[2]},{ids[3]}",
        {"action": "cancel", "select_across": "1", "_selected_action": ids[1:2]},
        follow=True,
    )
    assert messages_of(page) == ["3 orders updated."]
    assert (
        list(statuses.order_by("pk"))
        == [Order.Status.PENDING_PAYMENT] + [Order.Status.CANCELLED] * 3
    )


@pytest.mark.django_db(transaction=True)
def test_an_adjustment_sent_from_two_browsers_at_once_is_applied_once(
    admin_user, on_postgres
):
    """The same Adjust stock form submitted at the same instant (a double click,
    or the page open in two browsers): the units move once, every press answers
    its redirect, and the later ones say the adjustment was already made."""
    from django.test import Client

    from orders.models import Product, StockMovement
    from orders.services import product_get_or_create, stock_top_up
    from tests.backoffice import messages_of
    from tests.conftest import run_in_threads

    tea, _ = product_get_or_create(sku="TEA", name="Tea", price=100, currency="CNY")
    stock_top_up(product_id=tea.pk, at_least=5)
    url = f"/admin/orders/product/{tea.pk}/adjust-stock/"
    opener = Client()
    opener.force_login(admin_user)
    token = opener.get(url, follow=True).context["form"].initial["token"]
    form = {"token": token, "quantity": "-3", "note": "broken in the warehouse"}

    def submit(i: int):
        browser = Client(raise_request_exception=False)
        browser.force_login(admin_user)
        return browser.post(url, form, follow=True)

    pages = run_in_threads(4, submit)
    assert [p.status_code for p in pages] == [200] * 4
    said = [m for page in pages for m in messages_of(page)]
    assert said.count("Stock adjusted.") == 1, said
    assert said.count("This adjustment was already made; nothing changed.") == 3
    assert Product.objects.get(pk=tea.pk).stock == 2
    assert StockMovement.objects.filter(kind="adjustment").count() == 1


@pytest.mark.django_db(transaction=True)
def test_removals_from_two_forms_at_once_never_take_more_than_there_is(
    admin_user, on_postgres
):
    """Two staff members each remove 3 of the 5 units at the same instant, each
    from their own form: one removal is made, the other is refused on its form
    (400) with the stock it found, and the stock never goes below zero."""
    from django.test import Client

    from orders.models import Product, StockMovement
    from orders.services import product_get_or_create, stock_top_up
    from tests.conftest import run_in_threads

    tea, _ = product_get_or_create(sku="TEA", name="Tea", price=100, currency="CNY")
    stock_top_up(product_id=tea.pk, at_least=5)
    url = f"/admin/orders/product/{tea.pk}/adjust-stock/"
    browsers = []
    for _ in range(2):
        browser = Client(raise_request_exception=False)
        browser.force_login(admin_user)
        token = browser.get(url, follow=True).context["form"].initial["token"]
        browsers.append((browser, token))

    def submit(i: int):
        browser, token = browsers[i]
        form = {"token": token, "quantity": "-3", "note": "sold at the counter"}
        answer = browser.post(url, form)
        return answer.status_code, answer.content.decode()

    results = run_in_threads(2, submit)
    assert sorted(status for status, _ in results) == [302, 400], results
    (refused,) = [page for status, page in results if status == 400]
    assert "Only 2 in stock: 3 cannot be removed. Nothing changed." in refused
    assert Product.objects.get(pk=tea.pk).stock == 2
    assert StockMovement.objects.filter(kind="adjustment").count() == 1


@pytest.mark.django_db(transaction=True)
def test_ship_pressed_at_once_by_several_staff_ships_once(admin_user, on_postgres):
    from django.test import Client

    from tests.backoffice import messages_of
    from tests.conftest import run_in_threads

    user, _, _ = customer("alice", balance=10_000)
    order = place_order(user)
    payment_pay_with_balance(order_id=order.pk)

    def press(i: int):
        browser = Client(raise_request_exception=False)
        browser.force_login(admin_user)
        return browser.post(
            "/admin/orders/order/",
            {"action": "ship", "_selected_action": [order.pk]},
            follow=True,
        )

    pages = run_in_threads(4, press)
    assert [p.status_code for p in pages] == [200] * 4
    said = [m for page in pages for m in messages_of(page)]
    assert said.count("1 order updated.") == 1, said
    refusal = (
        f"Order {order.merchant_order_no} is Shipped; it cannot be shipped. "
        "Not changed."
    )
    assert said.count(refusal) == 3, said
    order.refresh_from_db()
    assert order.status == Order.Status.SHIPPED
