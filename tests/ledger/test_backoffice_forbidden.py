"""What the back office answers someone it does not let in: a customer gets the
admin's own log-in page, which says they are not authorized; a staff member without
the permission a page needs gets the back office's 403 page, which says so and leads
back to the back office, never the shop's "Not allowed" page in the shop's layout."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from tests.helpers import customer

pytestmark = pytest.mark.django_db

ACCOUNTS = "/admin/ledger/account/"


def staff_member(*permissions: str) -> Client:
    member = get_user_model().objects.create_user("clerk", is_staff=True)
    for codename in permissions:
        member.user_permissions.add(Permission.objects.get(codename=codename))
    browser = Client(raise_request_exception=False)
    browser.force_login(member)
    return browser


def assert_back_office_403(answer) -> str:
    assert answer.status_code == 403, answer.content[:500]
    assert answer.templates[0].name == "admin/403.html"
    page = answer.content.decode()
    assert 'class="topbar"' not in page and "css/app.css" not in page  # not the shop
    assert 'href="/admin/"' in page and 'href="/"' in page
    return page


def test_a_customer_gets_the_admins_log_in_page_that_says_why():
    user, _, wallet = customer("alice")
    browser = Client()
    browser.force_login(user)
    for url in ("/admin/", ACCOUNTS, f"{ACCOUNTS}{wallet.pk}/change/"):
        answer = browser.get(url, follow=True)
        assert answer.redirect_chain[-1][0].startswith("/admin/login/?next="), url
        page = answer.content.decode()
        assert answer.status_code == 200
        assert "You are authenticated as alice, but are not authorized" in page
        assert "Not allowed" not in page


def test_staff_without_the_models_permission_get_the_back_offices_403_page():
    browser = staff_member()
    for url in (ACCOUNTS, "/admin/ledger/journalentry/"):
        page = assert_back_office_403(browser.get(url))
        assert "Not allowed" in page
        assert "needs a permission your staff account (clerk)" in page
        assert "Back to the back office" in page
    zh = browser.get(ACCOUNTS, HTTP_ACCEPT_LANGUAGE="zh-Hans")
    page = assert_back_office_403(zh)
    assert "无权访问" in page and "返回后台" in page


def test_staff_without_an_actions_permission_get_the_back_offices_403_page():
    _, _, wallet = customer("alice", balance=100)
    browser = staff_member("view_account")
    url = f"{ACCOUNTS}backoffice/credit/?ids={wallet.pk}&token={'a' * 32}"
    assert "needs a permission" in assert_back_office_403(browser.get(url))


def test_staff_who_may_only_look_at_products_cannot_adjust_stock():
    """The product page offers them no "Adjust stock" button, and its page, asked for
    all the same, is the back office's 403 page (not an empty one); nothing moves."""
    from orders.models import StockMovement
    from orders.services import product_get_or_create

    tea, _ = product_get_or_create(sku="TEA", name="Tea", price=100, currency="CNY")
    browser = staff_member("view_product")
    product_page = browser.get(f"/admin/orders/product/{tea.pk}/change/")
    assert product_page.status_code == 200
    assert "adjust-stock" not in product_page.content.decode()
    url = f"/admin/orders/product/{tea.pk}/adjust-stock/"
    assert "needs a permission" in assert_back_office_403(browser.get(url))
    posted = browser.post(url, {"token": "a" * 32, "quantity": "5", "note": "x"})
    assert "needs a permission" in assert_back_office_403(posted)
    assert not StockMovement.objects.exists()
