"""Every list in the back office refuses a filter it cannot apply as Django
refuses any bad filter (a redirect to `?e=1`, then the whole list), never with a
500 (ledger.adminsite). The sweep puts values that used to get through to a 500
in every column of every list the site holds, Django's own and other apps'
included: a year past 9999 or a date hierarchy's 9999, a regular expression that
does not parse, a range of one value, numbers past 64 bits (SQLite), text for a
binary column."""

import logging

import pytest
from django.apps import apps
from django.contrib import admin
from django.db import models
from django.utils import timezone

from orders.models import Order
from tests.helpers import customer, place_order

pytestmark = pytest.mark.django_db

HUGE = "9" * 25


def lists():
    for model in apps.get_models():
        if admin.site.is_registered(model):
            opts = model._meta
            url = f"/admin/{opts.app_label}/{opts.model_name}/"
            yield url, opts.concrete_fields, admin.site.get_model_admin(model)


def hostile_filters(fields, model_admin):
    # What fails alike on any column, once per list; then what depends on the type.
    yield "pk__regex=("
    yield "pk__range=1"
    yield f"pk__gt=-{HUGE}"
    for field in fields:
        name = field.attname
        yield f"{name}=x"
        yield f"{name}__in={HUGE}"
        if isinstance(field, models.DateField):
            yield f"{name}__year=99999"
            yield f"{name}__year__in={HUGE}"
    if hierarchy := model_admin.date_hierarchy:
        yield f"{hierarchy}__year=9999"
        yield f"{hierarchy}__year=9999&{hierarchy}__month=12"
        yield f"{hierarchy}__year=9999&{hierarchy}__month=12&{hierarchy}__day=31"
        yield f"{hierarchy}__year=2026&{hierarchy}__month={HUGE}"


def test_no_filter_on_any_list_gets_a_500(admin_client, caplog):
    user, _, _ = customer("alice", balance=100)
    place_order(user, amount=100)
    caplog.set_level(logging.CRITICAL, logger="ledger.adminsite")  # (by the hundred)
    swept = 0
    for url, fields, model_admin in lists():
        for query in hostile_filters(fields, model_admin):
            response = admin_client.get(f"{url}?{query}")
            # (400: a lookup Django never allows, such as on a password)
            assert response.status_code in (200, 302, 400), (url, query)
            if response.status_code == 302:
                assert response["Location"] == f"{url}?e=1", (url, query)
            swept += 1
    assert swept > 500  # every column of every list was tried


def test_a_refused_filter_leads_to_the_whole_list_and_is_logged(admin_client, caplog):
    response = admin_client.get("/admin/orders/order/?created_at__year=99999")
    assert response.status_code == 302
    assert admin_client.get(response["Location"]).status_code == 200
    assert "admin list /admin/orders/order/ refused its filters" in caplog.text


def test_a_fault_in_a_list_without_filters_is_still_a_500(admin_client, monkeypatch):
    """Nothing in its address to refuse: the fault is the code's, and shows."""
    order_admin = admin.site.get_model_admin(Order)

    def broken(request):
        raise ValueError("a fault of the code's")

    monkeypatch.setattr(order_admin, "get_queryset", broken)
    admin_client.raise_request_exception = False
    assert admin_client.get("/admin/orders/order/").status_code == 500


def test_a_list_of_its_own_kind_is_kept(admin_client):
    """DRF's token admin has a change list of its own, whose rows link by the
    user's id (a token's key is no address): the site keeps it."""
    user, _, _ = customer("alice")
    page = admin_client.get("/admin/authtoken/tokenproxy/").content.decode()
    assert f'href="/admin/authtoken/tokenproxy/{user.pk}/change/' in page


def test_a_year_that_exists_still_filters(admin_client):
    user, _, _ = customer("alice", balance=0)
    order = place_order(user, amount=100)
    year = timezone.now().year
    listed = admin_client.get(f"/admin/orders/order/?created_at__year={year}")
    assert order.merchant_order_no in listed.content.decode()
    other = admin_client.get(f"/admin/orders/order/?created_at__year={year - 1}")
    assert order.merchant_order_no not in other.content.decode()
    users = admin_client.get(f"/admin/auth/user/?date_joined__year={year - 1}")
    assert users.status_code == 200 and "alice" not in users.content.decode()
