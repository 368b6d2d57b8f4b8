""" "Forget this key" in the admin: only a key still before its first recovery point
(nothing but its record committed) may be forgotten, each time recorded in the audit
log with who and when; a second press, or two staff members at once, forget it once."""

import pytest
from django.db import connection, transaction

from idempotency.models import AuditEntry, IdempotencyRecord
from idempotency.records import Claimed, claim
from idempotency.services import KeyNotForgettable, record_forget
from tests.backoffice import call_of, messages_of, staff, stuck
from tests.conftest import run_in_threads
from tests.factories import IdempotencyRecordFactory

pytestmark = pytest.mark.django_db

RECORDS = "/admin/idempotency/idempotencyrecord/"


def forget(client, *records):
    return client.post(
        RECORDS,
        {"action": "forget", "_selected_action": [r.pk for r in records]},
        follow=True,
    )


def test_forget_frees_the_key_and_records_who(admin_client, admin_user):
    record = stuck()
    response = forget(admin_client, record)
    assert response.status_code == 200
    assert not IdempotencyRecord.objects.filter(pk=record.pk).exists()
    entry = AuditEntry.objects.get()
    assert (entry.actor, entry.actor_name, entry.action) == (
        admin_user,
        admin_user.username,
        AuditEntry.Action.FORGET,
    )
    assert (entry.scope, entry.key, entry.endpoint) == (
        record.scope,
        record.key,
        "orders.pay",
    )
    assert entry.record["recovery_point"] == "started"
    assert any("forgotten" in m for m in messages_of(response))
    # The key is free: the client's retry starts afresh.
    call = call_of(record)
    assert claim(call).outcome == Claimed.NEW
    # The audit log is read-only.
    page = admin_client.get(f"/admin/idempotency/auditentry/{entry.pk}/change/")
    assert page.status_code == 200
    assert b'name="_save"' not in page.content
    assert admin_client.get("/admin/idempotency/auditentry/add/").status_code == 403


def test_forget_pressed_twice_forgets_once(admin_client):
    record = stuck()
    forget(admin_client, record)
    again = forget(admin_client, record)
    assert again.status_code == 200  # the record is gone: nothing selected any more
    assert AuditEntry.objects.count() == 1
    with pytest.raises(KeyNotForgettable), transaction.atomic():
        record_forget(record_id=record.pk, actor_id=None, actor_name="ops")
    assert AuditEntry.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_forget_from_two_browsers_at_once_forgets_once(admin_user, on_postgres):
    record = stuck()
    results = run_in_threads(
        2, lambda i: messages_of(forget(staff(admin_user), record))
    )
    assert not IdempotencyRecord.objects.filter(pk=record.pk).exists()
    assert AuditEntry.objects.count() == 1
    shown = [m for messages in results for m in messages]
    assert sum("forgotten;" in m for m in shown) == 1, shown
    connection.close()


@pytest.mark.parametrize(
    "values",
    [
        {},  # finished: its stored response is what a retry must get
        {
            "status": IdempotencyRecord.Status.PROCESSING,
            "recovery_point": "payment_created",
            "response_status": None,
        },  # past a recovery point: effects committed
    ],
)
def test_a_key_past_its_first_recovery_point_is_never_forgotten(admin_client, values):
    record = IdempotencyRecordFactory(**values)
    response = forget(admin_client, record)
    assert response.status_code == 200
    assert IdempotencyRecord.objects.filter(pk=record.pk).exists()
    assert not AuditEntry.objects.exists()
    assert any("was not forgotten" in m for m in messages_of(response))


def test_records_cannot_be_deleted_around_the_guard(admin_client):
    record = IdempotencyRecordFactory()
    page = admin_client.get(RECORDS).content.decode()
    assert "delete_selected" not in page
    assert admin_client.get(f"{RECORDS}{record.pk}/delete/").status_code == 403
