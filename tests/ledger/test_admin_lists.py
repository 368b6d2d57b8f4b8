"""Every list in the back office refuses a filter it cannot apply the way Django
refuses any bad filter (a redirect to `?e=1`, the list unfiltered), never with a
500. Two values used to get through to a 500 (ledger.adminsite): a year past 9999
on any date column, and the year 9999 in a list's date hierarchy. The sweep covers
every admin the site holds, Django's own and other apps' included."""

import pytest
from django.contrib import admin
from django.db import models
from django.utils import timezone

from tests.helpers import customer, place_order

pytestmark = pytest.mark.django_db


def lists():
    for model, model_admin in admin.site._registry.items():
        opts = model._meta
        url = f"/admin/{opts.app_label}/{opts.model_name}/"
        dates = [
            field.name
            for field in opts.get_fields()
            if isinstance(field, models.DateField) and field.concrete
        ]
        yield url, dates, model_admin.date_hierarchy


def hostile_filters(dates, hierarchy):
    for name in dates:
        yield f"{name}__year=99999"
        yield f"{name}__year=9999"
        yield f"{name}__gte=99999-01-01"
    if hierarchy:
        yield f"{hierarchy}__year=9999"
        yield f"{hierarchy}__year=9999&{hierarchy}__month=12"
        yield f"{hierarchy}__year=9999&{hierarchy}__month=12&{hierarchy}__day=31"
        yield f"{hierarchy}__year=2026&{hierarchy}__month={'9' * 30}"


def test_no_filter_on_any_list_gets_a_500(admin_client):
    swept = 0
    for url, dates, hierarchy in lists():
        for query in hostile_filters(dates, hierarchy):
            response = admin_client.get(f"{url}?{query}")
            assert response.status_code in (200, 302), (url, query)
            if response.status_code == 302:
                assert response["Location"] == f"{url}?e=1", (url, query)
            swept += 1
    assert swept > 100  # every list with a date column was tried


def test_the_refused_year_redirects_to_the_whole_list(admin_client):
    response = admin_client.get("/admin/orders/order/?created_at__year=9999")
    assert response.status_code == 302
    page = admin_client.get(response["Location"])
    assert page.status_code == 200


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
