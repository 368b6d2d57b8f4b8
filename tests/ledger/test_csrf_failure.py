"""A form posted with a stale CSRF token (the session changed in another tab) gets a
403 page in the shop's layout linking back to where it came from; an API path gets
problem+json."""

import json
import re

import pytest
from django.test import Client, RequestFactory

from ledger.problems import csrf_failure
from tests.helpers import customer

pytestmark = pytest.mark.django_db

PASSWORD = "s3cret-pass-1"


@pytest.fixture
def browser() -> Client:
    user, _, _ = customer("bob")
    user.set_password(PASSWORD)
    user.save()
    return Client(enforce_csrf_checks=True)


def csrf_of(page) -> str:
    match = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page.content)
    assert match, page.content[:2000]
    return match.group(1).decode()


def log_in(browser: Client, token: str, **headers):
    return browser.post(
        "/login",
        {"username": "bob", "password": PASSWORD, "csrfmiddlewaretoken": token},
        headers=headers,
    )


def test_a_stale_tab_gets_a_page_out_of_date_linking_back(browser):
    stale = csrf_of(browser.get("/login"))
    # Another tab logs in: Django rotates the CSRF token, the first tab keeps the old
    assert log_in(browser, csrf_of(browser.get("/login"))).status_code == 302
    response = log_in(browser, stale, Referer="http://testserver/login?next=/orders")
    assert response.status_code == 403
    assert response["Content-Type"].startswith("text/html")
    assert [t.name for t in response.templates][:2] == [
        "csrf_failure.html",
        "base.html",
    ]
    html = response.content.decode()
    assert "Page out of date" in html
    assert 'class="topbar"' in html  # the shop's layout
    assert 'href="/login?next=/orders">Back to the page</a>' in html
    assert "CSRF verification failed" not in html


@pytest.mark.parametrize(
    "referer",
    [
        None,
        "https://evil.example/login",
        "//evil.example/x",
        "javascript:x",
        # Ours by its host, but its path alone is another site's address.
        "http://testserver//evil.example/x",
        "http://testserver/\\evil.example/x",
        "http://testserver/\\/evil.example/x",
    ],
)
def test_without_a_referer_of_ours_the_link_goes_home(browser, referer):
    headers = {"Referer": referer} if referer else {}
    response = log_in(browser, "x" * 32, **headers)
    assert response.status_code == 403
    html = response.content.decode()
    assert 'href="/">Go to the shop</a>' in html
    assert "evil" not in html and "javascript" not in html


def admin_log_in(browser, **headers: str) -> str:
    """The back office's log-in form sent with a stale (here: no) CSRF token: its
    403 page, in the back office's own template."""
    response = browser.post(
        "/admin/login/", {"username": "bob", "password": PASSWORD}, headers=headers
    )
    assert response.status_code == 403
    assert response.templates[0].name == "admin/csrf_failure.html"
    return response.content.decode()


def test_the_admin_gets_the_page_in_its_own_layout(browser):
    """As its 403 page: the back office's look and a way back into it, not the
    shop's layout (which it showed) around a back-office form."""
    browser.get("/admin/login/")
    html = admin_log_in(browser, Referer="http://testserver/admin/login/?next=/admin/")
    assert 'class="topbar"' not in html and "css/app.css" not in html
    assert "<h1>Page out of date</h1>" in html
    assert "was out of date" in html
    assert 'href="/admin/login/?next=/admin/">Back to the page</a>' in html
    assert "CSRF verification failed" not in html


def test_the_admin_without_a_referer_links_to_the_back_office(browser):
    html = admin_log_in(browser, **{"Accept-Language": "zh-hans"})
    assert 'href="/admin/">返回后台</a>' in html
    assert "页面已过期" in html


def test_the_page_is_translated(browser):
    response = log_in(browser, "x" * 32, **{"Accept-Language": "zh-hans"})
    assert response.status_code == 403
    assert "页面已过期" in response.content.decode()


def test_an_api_path_gets_problem_details():
    request = RequestFactory().post("/api/v1/orders")
    response = csrf_failure(request, reason="CSRF token missing.")
    assert response.status_code == 403
    assert response["Content-Type"] == "application/problem+json"
    assert json.loads(response.content) == {
        "type": "/problems/permission_denied",
        "title": "Permission denied",
        "status": 403,
        "detail": "CSRF Failed: CSRF token missing.",
        "code": "permission_denied",
    }
