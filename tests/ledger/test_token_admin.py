"""Staff never see a customer's API token in clear in the admin: a short prefix names
it, and revoking it (deleting) still works and still reaches Redis."""

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from ledger.services import customer_get_or_create

pytestmark = pytest.mark.django_db

TOKENS = "/admin/authtoken/tokenproxy/"


def customer(username: str) -> tuple:
    """(user, token key)"""
    user, token, _ = customer_get_or_create(username=username, currency="CNY")
    return user, token


def pages_of(admin_client, user) -> dict[str, str]:
    urls = {
        "list": TOKENS,
        "search": f"{TOKENS}?q={user.username}",
        "change": f"{TOKENS}{user.pk}/change/",
        "history": f"{TOKENS}{user.pk}/history/",
        "delete": f"{TOKENS}{user.pk}/delete/",
        "user delete": f"/admin/auth/user/{user.pk}/delete/",
    }
    pages = {}
    for name, url in urls.items():
        response = admin_client.get(url)
        assert response.status_code == 200, (name, response.status_code)
        pages[name] = response.content.decode()
    return pages


def test_no_page_shows_a_full_token(admin_client):
    user, token = customer("alice")
    pages = pages_of(admin_client, user)
    for name, html in pages.items():
        assert token not in html, name
    for name in ("list", "change", "delete"):
        assert f"{token[:6]}…" in pages[name], name


def test_deleting_a_user_names_their_token_by_its_prefix(admin_client):
    user = get_user_model().objects.create_user("dave")  # no wallet holds them back
    token = Token.objects.create(user=user).key
    html = admin_client.get(f"/admin/auth/user/{user.pk}/delete/").content.decode()
    assert "Are you sure" in html
    assert token not in html


def test_a_token_cannot_be_found_by_filtering_on_its_key(admin_client):
    _, token = customer("alice")
    customer("bob")
    for query in (
        f"key__startswith={token[:1]}",
        f"key={token}",
        f"key__gt={token}",
        f"pk__startswith={token[:1]}",  # the primary key is the key
        f"user__auth_token__key__startswith={token[:1]}",
    ):
        response = admin_client.get(f"{TOKENS}?{query}")
        assert response.status_code in (302, 400), query
        assert token not in response.content.decode()


def test_revoking_a_token_in_the_admin_deletes_it_and_shows_no_key(admin_client):
    user, token = customer("alice")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert api.get("/api/v1/accounts/me").status_code == 200
    response = admin_client.post(f"{TOKENS}{user.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not Token.objects.filter(user=user).exists()
    assert api.get("/api/v1/accounts/me").status_code == 401
    # The message, the recent actions and the log carry no key either.
    for page in (admin_client.get(response["Location"]), admin_client.get("/admin/")):
        assert token not in page.content.decode()
        assert f"{token[:6]}…" in page.content.decode()


def test_a_token_added_in_the_admin_is_not_shown(admin_client):
    user = get_user_model().objects.create_user("carol")
    response = admin_client.post(f"{TOKENS}add/", {"user": user.pk}, follow=True)
    assert response.status_code == 200
    token = Token.objects.get(user=user).key
    assert token not in response.content.decode()
    assert token not in admin_client.get("/admin/").content.decode()


@pytest.mark.django_db(transaction=True)
def test_a_token_added_twice_at_once_for_one_user_is_added_once(admin_user):
    """The same race on a form the site did not write (DRF's tokens: one per user)."""
    from django.test import Client

    from tests.conftest import run_in_threads
    from tests.factories import UserFactory

    user = UserFactory()

    def work(i: int) -> int:
        client = Client()
        client.force_login(admin_user)
        form = {"user": str(user.pk)}
        return client.post(f"{TOKENS}add/", form).status_code

    results = run_in_threads(6, work)
    assert sorted(results) == [200] * 5 + [302], results
    assert Token.objects.filter(user=user).count() == 1


def test_a_token_cannot_be_handed_to_another_user(admin_client):
    """Its user is fixed: a token moved to another user would let whoever holds
    it (staff who may change tokens, holding their own) act as that user in the
    API, and spend their wallet."""
    alice = get_user_model().objects.create_user("alice")  # no token of her own
    clerk, clerks_token = customer("clerk")
    admin_client.post(f"{TOKENS}{clerk.pk}/change/", {"user": alice.pk})
    assert Token.objects.get(key=clerks_token).user == clerk
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {clerks_token}")
    assert api.get("/api/v1/accounts/me").json()["id"] == clerk.accounts.get().pk
