"""A request this site refuses as bad, a Host header it does not serve above all:
problem+json with a stable code on an API path, the shop's 400 page on any other;
never Django's bare page, never a 5xx."""

import pytest
from django.test import Client

from tests.helpers import assert_problem, customer, place_order

pytestmark = pytest.mark.django_db

HOSTS = ["evil.example", "10.0.3.7:8000", "bad host", "a..b", "x" * 300]
PAGES = ["/", "/orders", "/orders/new", "/login", "/account", "/admin/", "/no-such"]


@pytest.fixture
def shopper() -> Client:
    """A logged-in browser: its session and CSRF cookies go with the bad host too."""
    user = customer("alice", balance=10_000)[0]
    browser = Client()
    browser.force_login(user)
    browser.get("/login")
    return browser


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("path", PAGES)
def test_a_page_asked_by_a_host_not_served_answers_the_shops_400_page(
    shopper, path, host
):
    for answer in (
        shopper.get(path, HTTP_HOST=host),
        shopper.post(path, {"amount": "5"}, HTTP_HOST=host),
    ):
        assert answer.status_code == 400, answer.content[:300]
        assert answer["Content-Type"] == "text/html; charset=utf-8"
        page = answer.content.decode()
        assert 'id="bad-request"' in page and "css/app.css" in page  # the layout
        assert "not served at the address you asked for" in page
        # Nothing minted for a host this site is not served at, nothing to post.
        assert "csrfmiddlewaretoken" not in page and "<form" not in page
        assert not answer.cookies
        assert "Traceback" not in page and "DisallowedHost" not in page


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize(
    "path", ["/api/v1/accounts/me", "/api/v1/orders", "/api/v1/no-such"]
)
def test_an_api_path_asked_by_a_host_not_served_answers_a_problem(path, host):
    api = customer("bob")[1]
    for answer in (
        api.get(path, HTTP_HOST=host),
        api.post(path, {}, format="json", HTTP_HOST=host, HTTP_IDEMPOTENCY_KEY="k-1"),
    ):
        body = assert_problem(answer, 400, "host_not_allowed")
        assert body["title"] == "Host not allowed"


def test_the_400_page_reads_in_the_readers_language(client):
    answer = client.get("/orders", HTTP_HOST="evil.example", HTTP_ACCEPT_LANGUAGE="zh")
    assert answer.status_code == 400
    assert "请求有误" in answer.content.decode()


def test_a_page_refusing_a_request_answers_the_same_page_with_a_way_back(shopper):
    order = place_order(customer("alice")[0])
    answer = shopper.post(f"/orders/{order.merchant_order_no}/pay", {"method": "bank"})
    assert answer.status_code == 400
    page = answer.content.decode()
    assert 'id="bad-request"' in page and "could not understand this request" in page
    assert 'href="/"' in page  # to the shop


@pytest.mark.parametrize("path", ["/orders", "/api/v1/orders"])
def test_with_debug_on_a_host_not_served_gets_djangos_debug_page(
    client, settings, path
):
    """DJANGO_DEBUG=true is a developer's machine: the host refused is most likely
    the developer's own (a LAN address, a container's name), and Django's debug
    page names the setting to add it to, as it does for every other error in
    DEBUG (a 404, a 500). The shop's page and the problem are for DEBUG off."""
    settings.DEBUG = True
    answer = client.get(path, HTTP_HOST="dev-box.lan:8000")
    assert answer.status_code == 400
    page = answer.content.decode()
    assert "DisallowedHost" in page and "ALLOWED_HOSTS" in page
    assert "dev-box.lan" in page
