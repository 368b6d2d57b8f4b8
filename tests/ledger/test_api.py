import pytest
from rest_framework.test import APIClient

from ledger.services import customer_get_or_create, ledger_deposit
from tests.helpers import assert_problem

pytestmark = pytest.mark.django_db


@pytest.fixture
def customer():
    _user, token, wallet = customer_get_or_create(username="erin", currency="CNY")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client, wallet


@pytest.mark.parametrize(
    "query",
    ["page_size=0", "page_size=", "cursor=", "cursor=bm9wZQ", "cursor=cD1ub3Bl"],
)
def test_a_refused_entries_query_makes_no_wallet(query):
    """A refusal changes nothing: the wallet `accounts/me` makes when it first
    shows it was made, empty, before the query was refused."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from ledger.models import Account

    dave = get_user_model().objects.create_user("dave")
    client = APIClient()
    client.credentials(
        HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=dave).key}"
    )
    response = client.get(f"/api/v1/accounts/me/entries?{query}")
    assert_problem(response, 400, "validation_error")
    assert not Account.objects.filter(owner=dave).exists()


def test_account_me(customer):
    client, wallet = customer
    ledger_deposit(account_id=wallet.pk, amount=1234, reference="d")
    response = client.get("/api/v1/accounts/me")
    assert response.status_code == 200
    assert response.json() == {
        "id": wallet.pk,
        "currency": "CNY",
        "balance": 1234,
        "held": 0,
        "available": 1234,
        "version": 1,
    }


def test_entries_newest_first_and_paginated(customer):
    client, wallet = customer
    for n in range(1, 4):
        ledger_deposit(account_id=wallet.pk, amount=n, reference=f"d{n}")
    page = client.get("/api/v1/accounts/me/entries?page_size=2").json()
    assert [p["amount"] for p in page["results"]] == [3, 2]
    assert page["results"][0]["kind"] == "deposit"
    rest = client.get(page["next"]).json()
    assert [p["amount"] for p in rest["results"]] == [1]


@pytest.mark.parametrize("header", [None, "Token nope", "Bearer x"])
def test_api_needs_a_valid_token(header):
    client = APIClient()
    if header:
        client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get("/api/v1/accounts/me")
    code = (
        "not_authenticated" if header in (None, "Bearer x") else "authentication_failed"
    )
    assert_problem(response, 401, code)


def test_unknown_api_path_is_a_problem(customer):
    client, _ = customer
    assert_problem(client.get("/api/v1/nowhere"), 404, "not_found")


def test_wrong_method_is_a_problem(customer):
    client, _ = customer
    assert_problem(client.delete("/api/v1/accounts/me"), 405, "method_not_allowed")


def test_health_and_readiness(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"]["database"] == "ok"


def test_not_ready_is_a_problem_naming_the_failed_check(client, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    body = assert_problem(client.get("/readyz"), 503, "not_ready")
    assert body["checks"] == {"database": "ok", "redis": "error: unreachable"}
    assert "redis" in body["detail"]


def test_the_api_answers_in_english_whatever_the_caller_asks_for(customer):
    """One language in a body: Django's and DRF's own messages (a field's "This
    field is required.") as well as the project's, so that a stored answer replayed
    to a retry that asks for another language is still true to its header."""
    client, _ = customer
    asked = {"HTTP_ACCEPT_LANGUAGE": "zh-hans", "HTTP_IDEMPOTENCY_KEY": "zh-1"}
    refused = client.post("/api/v1/transfers", {}, format="json", **asked)
    assert_problem(refused, 400, "validation_error")
    assert refused["Content-Language"] == "en"
    assert "This field is required." in refused.content.decode()
    unknown = client.get("/api/v1/nowhere", HTTP_ACCEPT_LANGUAGE="zh-hans")
    assert unknown["Content-Language"] == "en"
    assert "Not found" in unknown.json()["title"]


def test_the_shop_keeps_the_readers_language(client):
    page = client.get("/accounts/login/", HTTP_ACCEPT_LANGUAGE="zh-hans")
    assert page["Content-Language"] == "zh-hans"


PROBLEMS_ONLY = "application/problem+json"


@pytest.mark.parametrize("accept", [PROBLEMS_ONLY, "application/problem+json; q=0.5"])
def test_a_client_accepting_only_problems_gets_its_answers(customer, accept):
    """DRF answered it 406 whatever it asked, before even reading the token: now an
    error is the problem document it accepts, a success the API's JSON."""
    client, wallet = customer
    ok = client.get("/api/v1/accounts/me", HTTP_ACCEPT=accept)
    assert ok.status_code == 200, ok.content
    assert ok["Content-Type"] == "application/json"
    assert ok.json()["id"] == wallet.pk
    made = client.post("/api/v1/preorders", HTTP_ACCEPT=accept)
    assert made.status_code == 201, made.content
    assert_problem(
        client.get("/api/v1/orders/nope", HTTP_ACCEPT=accept), 404, "not_found"
    )
    assert_problem(
        client.post(
            "/api/v1/orders",
            {"merchant_order_no": made.json()["merchant_order_no"], "amount": 0},
            format="json",
            headers={"Idempotency-Key": "k-1", "Accept": accept},
        ),
        400,
        "validation_error",
    )
    assert_problem(
        APIClient().get("/api/v1/accounts/me", HTTP_ACCEPT=accept),
        401,
        "not_authenticated",
    )


@pytest.mark.parametrize(
    "accept", ["application/xml", "text/html", "application/problem+json;q=0"]
)
def test_an_accept_naming_nothing_the_api_answers_in_is_a_406_saying_so(
    customer, accept
):
    client, _ = customer
    body = assert_problem(
        client.get("/api/v1/accounts/me", HTTP_ACCEPT=accept), 406, "not_acceptable"
    )
    assert body["detail"] == (
        "Accept names none of the media types this answers in: application/json "
        "(and application/problem+json for an error)."
    )
