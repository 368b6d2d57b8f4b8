"""A page that is not there, not allowed, or fails gets the shop's error page (its
layout, its language, a way back to the shop), never Django's bare one; the 500
page renders with nothing but its template, the database aside. An API path keeps
answering problem+json. With DEBUG off, as `make run` serves."""

import re

import httpx
import pytest
from django.http import HttpResponse
from django.test import Client, RequestFactory

from ledger.problems import server_error
from tests.helpers import assert_problem, customer, place_order
from tests.servers import gunicorn

pytestmark = pytest.mark.django_db

BARE = ("<h1>Not Found</h1>", "Server Error (500)", "403 Forbidden", "Traceback")


@pytest.fixture(autouse=True)
def debug_off(settings):
    assert settings.DEBUG is False  # as `make run` serves, unless told otherwise


@pytest.fixture
def shopper() -> Client:
    browser = Client(raise_request_exception=False)
    browser.force_login(customer("alice", balance=10_000)[0])
    return browser


def assert_shop_page(answer: HttpResponse, status: int, page_id: str) -> str:
    """The shop's page: its layout, the page's section, a way back to the shop."""
    assert answer.status_code == status, answer.content[:500]
    assert answer["Content-Type"] == "text/html; charset=utf-8"
    page = answer.content.decode()
    assert f'id="{page_id}"' in page and "css/app.css" in page, page
    assert 'class="topbar"' in page and 'class="wrap footer"' in page
    assert re.search(r'<a class="btn btn-primary btn-block" href="/">', page), page
    assert not any(bare in page for bare in BARE), page
    return page


@pytest.mark.parametrize(
    "path", ["/no-such", "/orders/999999999", "/orders/999999999/live", "/static/x"]
)
def test_a_page_not_there_gets_the_shops_404_page(shopper, path):
    answer = shopper.get(path)
    page = assert_shop_page(answer, 404, "not-found")
    assert [t.name for t in answer.templates][:2] == ["404.html", "base.html"]
    assert "Page not found" in page
    # Rendered with its request: the shopper's menu and the language form.
    assert 'href="/orders"' in page and 'name="language"' in page


def test_someone_elses_order_is_not_there_either(shopper):
    order = place_order(customer("bob", balance=1000)[0])
    answer = shopper.get(f"/orders/{order.merchant_order_no}")
    assert_shop_page(answer, 404, "not-found")


def test_the_404_page_reads_in_the_readers_language(client):
    answer = client.get("/no-such", HTTP_ACCEPT_LANGUAGE="zh-Hans")
    page = assert_shop_page(answer, 404, "not-found")
    assert "页面不存在" in page and "前往商店" in page


@pytest.mark.urls("tests.ledger.error_urls")
def test_a_page_that_fails_gets_the_shops_500_page(shopper):
    answer = shopper.get("/test/broken")
    page = assert_shop_page(answer, 500, "server-error")
    assert [t.name for t in answer.templates][:2] == ["500.html", "base.html"]
    assert "Something went wrong on our side" in page
    # Rendered without its request, as Django renders it: no menu of the user,
    # nothing minted, nothing to post.
    assert 'href="/orders"' not in page and "Log out" not in page
    assert "<form" not in page and "csrfmiddlewaretoken" not in page


@pytest.mark.urls("tests.ledger.error_urls")
def test_the_500_page_reads_in_the_readers_language():
    answer = Client(raise_request_exception=False).get(
        "/test/broken", HTTP_ACCEPT_LANGUAGE="zh-Hans"
    )
    page = assert_shop_page(answer, 500, "server-error")
    assert '<html lang="zh-hans">' in page
    assert "出错了" in page and "前往商店" in page


def test_the_500_page_renders_with_the_database_out_of_reach(django_db_blocker):
    """What failed may be the database: the page asks nothing of it."""
    request = RequestFactory().get("/orders")
    with django_db_blocker.block():
        answer = server_error(request)
    assert_shop_page(answer, 500, "server-error")


def test_a_500_page_that_cannot_render_falls_back_to_djangos(settings, tmp_path):
    """A fault in the layout the page extends: Django's bare page, not no answer."""
    (tmp_path / "500.html").write_text(
        '{% extends "base.html" %}{% block content %}{% url "gone" %}{% endblock %}'
    )
    settings.TEMPLATES = [
        {**settings.TEMPLATES[0], "DIRS": [tmp_path, *settings.TEMPLATES[0]["DIRS"]]}
    ]
    answer = server_error(RequestFactory().get("/orders"))
    assert answer.status_code == 500
    assert answer.content == b"<h1>Server Error (500)</h1>"


@pytest.mark.urls("tests.ledger.error_urls")
def test_a_page_not_allowed_gets_the_shops_403_page(shopper):
    answer = shopper.get("/test/forbidden")
    page = assert_shop_page(answer, 403, "forbidden")
    assert "Not allowed" in page
    zh = shopper.get("/test/forbidden", HTTP_ACCEPT_LANGUAGE="zh-Hans")
    assert "无权访问" in assert_shop_page(zh, 403, "forbidden")


@pytest.mark.urls("tests.ledger.error_urls")
def test_an_api_path_keeps_answering_problems():
    api = customer("carol")[1]
    api.raise_request_exception = False
    assert_problem(api.get("/api/v1/no-such"), 404, "not_found")
    assert_problem(api.get("/api/v1/orders/999999999"), 404, "not_found")
    body = assert_problem(api.get("/api/v1/test/broken"), 500, "internal_error")
    assert "safe to retry" in body["detail"]
    assert_problem(api.get("/api/v1/test/forbidden"), 403, "permission_denied")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_served_as_make_run_serves_them(tmp_path):
    """gunicorn on the settings `make run` uses (DEBUG off), views that fail added."""
    with gunicorn(tmp_path, "tests.ledger.error_settings", DJANGO_DEBUG="false") as (
        url,
        _master,
    ):
        for path, status, page_id in [
            ("/no-such", 404, "not-found"),
            ("/test/broken", 500, "server-error"),
            ("/test/forbidden", 403, "forbidden"),
        ]:
            answer = httpx.get(f"{url}{path}")
            assert answer.status_code == status, answer.text
            assert answer.headers["content-type"] == "text/html; charset=utf-8"
            assert f'id="{page_id}"' in answer.text and "css/app.css" in answer.text
            assert not any(bare in answer.text for bare in BARE), answer.text
        for path, status, code in [
            ("/api/v1/no-such", 404, "not_found"),
            ("/api/v1/test/broken", 500, "internal_error"),
            ("/api/v1/test/forbidden", 403, "permission_denied"),
        ]:
            assert_problem(httpx.get(f"{url}{path}"), status, code)
