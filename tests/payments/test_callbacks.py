"""The signed callback endpoint and the processing service, in process.

The same paths through a real Celery worker are in `test_worker.py`.
"""

import hashlib
import hmac
import time

import pytest
from django.db import connection
from rest_framework.test import APIClient

from ledger.invariants import ledger_report
from ledger.services import external_account, merchant_account
from orders.models import Order
from orders.services import order_cancel
from payments.models import CallbackNonce, Payment, ProviderEvent, Refund, Shipment
from payments.services import (
    payment_pay_with_balance,
    provider_event_process,
    shipment_dispatch,
)
from payments.signatures import sign
from tests.conftest import run_in_threads
from tests.helpers import (
    assert_problem,
    assert_settled_once,
    balance,
    customer,
    event_body,
    pending_provider_payment,
    place_order,
    post_callback,
    raw,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def payment():
    user, _, _ = customer("alice")
    return pending_provider_payment(place_order(user, amount=2500))


def process_all() -> None:
    for pk in ProviderEvent.objects.values_list("pk", flat=True):
        provider_event_process(event_id=pk)


def test_a_valid_callback_is_stored_then_processed(payment):
    body = event_body(payment)
    response = post_callback(body)
    assert response.status_code == 200, response.content
    assert response.json() == {"code": "SUCCESS"}
    event = ProviderEvent.objects.get()
    assert (event.event_id, event.status, event.payment) == (
        body["event_id"],
        "received",
        payment,
    )
    assert event.payload == body and event.raw_body == raw(body).decode()
    payment.refresh_from_db()
    assert payment.status == Payment.Status.PENDING  # nothing until the task runs
    process_all()
    assert_settled_once(payment)
    event.refresh_from_db()
    assert event.status == "processed" and event.processed_at


def test_the_same_event_again_is_acknowledged_and_changes_nothing(payment):
    body = event_body(payment)
    assert post_callback(body).status_code == 200
    process_all()
    again = post_callback(body)  # fresh signature, same event
    assert again.status_code == 200 and again.json() == {"code": "SUCCESS"}
    assert ProviderEvent.objects.count() == 1
    process_all()
    process_all()  # a redelivered task
    assert_settled_once(payment)


@pytest.mark.parametrize(
    "change",
    [{"status": "SUCCESS"}, {"amount": 999}, {"provider_txn_id": "other-txn"}],
)
def test_an_event_id_reused_for_another_event_is_refused_and_changes_nothing(
    payment, change, caplog
):
    """A provider reusing an event id for another event (say one id per
    transaction): acknowledged as a redelivery, the second event would vanish
    unseen; it is refused, loudly, and the first one stands."""
    first = event_body(payment, status="FAILED")
    assert post_callback(first).status_code == 200
    process_all()
    other = {**first, **change}
    refused = post_callback(other)
    assert_problem(refused, 409, "callback_event_reused")
    assert refused.json()["fields"] == list(change)
    assert "delivered again with another" in caplog.text
    assert ProviderEvent.objects.get().payload == first
    payment.refresh_from_db()
    assert payment.status == Payment.Status.FAILED
    assert post_callback(first).status_code == 200  # its redelivery: still fine


def test_a_redelivery_of_an_unprocessed_event_sends_its_task_again(
    payment, django_capture_on_commit_callbacks
):
    """The process that stored the event may have died before it enqueued the task
    (found by `make chaos`: a SIGKILLed gunicorn worker left an event `received`
    until the inbox re-drive a minute later); the provider's redelivery sends it."""
    body = event_body(payment)
    with django_capture_on_commit_callbacks() as first:
        assert post_callback(body).status_code == 200
    with django_capture_on_commit_callbacks() as again:  # `first` never ran
        assert post_callback(body).status_code == 200
    assert len(first) == len(again) == 1
    process_all()
    with django_capture_on_commit_callbacks() as late:
        assert post_callback(body).status_code == 200
    assert late == []  # processed already: nothing to send
    assert_settled_once(payment)


def test_two_events_reporting_success_settle_once(payment):
    assert post_callback(event_body(payment)).status_code == 200
    assert post_callback(event_body(payment)).status_code == 200
    assert ProviderEvent.objects.count() == 2
    process_all()
    assert_settled_once(payment)
    assert set(ProviderEvent.objects.values_list("status", flat=True)) == {"processed"}


def test_a_failure_fails_the_payment_and_moves_no_money(payment):
    assert post_callback(event_body(payment, status="FAILED")).status_code == 200
    process_all()
    payment.refresh_from_db()
    assert payment.status == Payment.Status.FAILED
    assert balance(merchant_account(currency="CNY")) == 0
    payment.order.refresh_from_db()
    assert payment.order.status == Order.Status.PENDING_PAYMENT


def test_a_late_success_for_a_cancelled_order_is_refunded(payment):
    order_cancel(order_id=payment.order_id)
    assert post_callback(event_body(payment)).status_code == 200
    process_all()
    payment.refresh_from_db()
    payment.order.refresh_from_db()
    assert payment.status == Payment.Status.REFUNDED
    assert payment.order.status == Order.Status.CANCELLED
    refund = Refund.objects.get(payment=payment)
    assert refund.reason == "order_cancelled"
    assert balance(merchant_account(currency="CNY")) == 0
    assert balance(external_account(currency="CNY")) == 0
    assert not Shipment.objects.exists()
    assert ledger_report()["ok"]


def test_a_success_for_an_order_paid_otherwise_is_refunded():
    user, _, wallet = customer("bob", balance=5000)
    order = place_order(user, amount=2500)
    payment = pending_provider_payment(order)
    payment_pay_with_balance(order_id=order.pk)
    assert post_callback(event_body(payment)).status_code == 200
    process_all()
    payment.refresh_from_db()
    assert payment.status == Payment.Status.REFUNDED
    assert Refund.objects.get(payment=payment).reason == "order_already_paid"
    assert balance(wallet) == 2500
    assert balance(merchant_account(currency="CNY")) == 2500
    assert ledger_report()["ok"]


@pytest.mark.parametrize(
    "override",
    [
        {"amount": 2499},
        # Past the largest amount an order may have, or not positive, within 64
        # bits: still an amount that is not the payment's (it was a 400
        # validation_error for its form, where a transfer or a capture says 422).
        {"amount": 10**15 + 1},
        {"amount": 2**63 - 1},
        {"amount": 0},
        {"amount": -(2**63)},
        {"provider_txn_id": "T-someone-else"},
        {"merchant_order_no": "999999"},
    ],
)
def test_a_mismatch_is_400_and_stores_nothing(payment, override):
    response = post_callback(event_body(payment, **override))
    assert_problem(response, 400, "callback_mismatch")
    assert not ProviderEvent.objects.exists()
    payment.refresh_from_db()
    assert payment.status == Payment.Status.PENDING


def test_a_balance_payment_is_not_a_provider_payment():
    user, _, _ = customer("carol", balance=5000)
    order = place_order(user, amount=100)
    paid = payment_pay_with_balance(order_id=order.pk)
    body = event_body(paid, provider_txn_id="T1")
    assert_problem(post_callback(body), 400, "callback_mismatch")


def test_a_replayed_signature_is_refused(payment, settings):
    body = event_body(payment)
    header = sign(secret=settings.PAYMENT_PROVIDER_SECRET, body=raw(body))
    assert post_callback(body, header=header).status_code == 200
    assert_problem(
        post_callback(body, header=header), 401, "callback_signature_invalid"
    )
    assert ProviderEvent.objects.count() == 1


@pytest.mark.parametrize(
    "header",
    [
        "",
        "garbage",
        "t=1,n=abcdefgh,v1=" + "0" * 64,
        "t=,n=,v1=",
        "t=1700000000,n=abcdefgh,v1=XYZ",
    ],
)
def test_missing_or_malformed_signatures_are_401(payment, header):
    response = post_callback(event_body(payment), header=header)
    assert_problem(response, 401, "callback_signature_invalid")
    assert not ProviderEvent.objects.exists()


def _signed_as_parsed(secret: str, t: str, n: str, body: bytes) -> str:
    """The MAC a lenient parser would check for these parts: right for the body,
    so only the header's form can refuse it."""
    signed = f"{t}.{n}.".encode() + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


@pytest.mark.parametrize(
    "form",
    [
        "t={t},n=,v1={v_empty}",  # an empty nonce
        "t={t},v1={v_empty}",  # no nonce
        "t=,n={n},v1={v_no_t}",  # an empty timestamp
        "n={n},v1={v_no_t}",  # no timestamp
        "t={t},n={n},v1=",  # an empty signature
        "t={t},n={n}",  # no signature
        "t={t},n={n},v1={v},v1={v}",  # a part twice
        "t={t},n={n},n={n},v1={v}",
        "t={t},t={t},n={n},v1={v}",
        "t={t},n={n},v1={v},",  # a part left empty
        "t={t},n={n},v1={v}\n",  # a line break after it
        "t={t_arabic},n={n},v1={v}",  # digits, but not ASCII ones
    ],
)
def test_a_header_with_a_part_empty_missing_or_repeated_is_401(payment, form, settings):
    body = raw(event_body(payment))
    secret = settings.PAYMENT_PROVIDER_SECRET
    t, n = str(int(time.time())), "nonce-1"
    header = form.format(
        t=t,
        n=n,
        v=_signed_as_parsed(secret, t, n, body),
        v_empty=_signed_as_parsed(secret, t, "", body),
        v_no_t=_signed_as_parsed(secret, "", n, body),
        t_arabic=t.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")),
    )
    for _ in range(2):  # refused every time, not accepted once
        response = post_callback(body, header=header)
        assert_problem(response, 401, "callback_signature_invalid")
    assert not ProviderEvent.objects.exists()
    assert not CallbackNonce.objects.exists()


def test_a_401_names_how_to_authenticate(payment):
    """RFC 9110: a 401 carries a WWW-Authenticate challenge; here, the signature
    header the provider must send."""
    response = post_callback(event_body(payment), secret="not-the-secret")
    assert_problem(response, 401, "callback_signature_invalid")
    assert response["WWW-Authenticate"] == 'Signature realm="provider-callbacks"'


def test_a_wrong_secret_or_a_changed_body_is_401(payment, settings):
    body = event_body(payment)
    assert_problem(
        post_callback(body, secret="not-the-secret"), 401, "callback_signature_invalid"
    )
    header = sign(secret=settings.PAYMENT_PROVIDER_SECRET, body=raw(body))
    tampered = raw({**body, "amount": 1})
    assert_problem(
        post_callback(tampered, header=header), 401, "callback_signature_invalid"
    )
    assert not ProviderEvent.objects.exists()


@pytest.mark.parametrize("skew", [-302, 302, -10_000])
def test_a_stale_or_future_timestamp_is_401(payment, skew):
    response = post_callback(event_body(payment), timestamp=int(time.time()) + skew)
    assert_problem(response, 401, "callback_signature_invalid")
    assert not ProviderEvent.objects.exists()


def test_a_nonce_seen_stays_seen_when_redis_is_lost(payment, settings):
    from payments.signatures import nonce_purge_expired

    body = event_body(payment)
    header = sign(secret=settings.PAYMENT_PROVIDER_SECRET, body=raw(body))
    assert post_callback(body, header=header).status_code == 200
    assert CallbackNonce.objects.count() == 1  # the database holds it, not Redis
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # Redis is gone: still refused
    assert_problem(
        post_callback(body, header=header), 401, "callback_signature_invalid"
    )
    assert nonce_purge_expired() == 0
    CallbackNonce.objects.update(expires_at="2000-01-01T00:00:00Z")
    assert nonce_purge_expired() == 1


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"\xff\xfe",
        b"[]",
        b"{}",
        b'{"event_id": 1}',
        b"null",
    ],
)
def test_signed_garbage_is_a_400_never_a_500(payment, body):
    response = post_callback(body)
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert not ProviderEvent.objects.exists()


def test_bad_field_values_are_400(payment):
    for override in (
        {"amount": "2500"},
        {"amount": 2500.0},
        {"amount": 10**30},
        {"status": "MAYBE"},
        {"event_id": ""},
        {"event_id": "x" * 129},
        {"merchant_order_no": "a\x00b"},
    ):
        response = post_callback(event_body(payment, **override))
        assert_problem(response, 400, "validation_error")
    assert not ProviderEvent.objects.exists()


@pytest.mark.parametrize(
    "override",
    [
        {"merchant_order_no": " {no}"},
        {"merchant_order_no": "{no}\n"},
        {"provider_txn_id": "{txn} "},
    ],
)
def test_an_identifier_with_whitespace_around_it_is_a_mismatch(payment, override):
    """Taken as sent, neither trimmed (`" <no>"` matched the order: the event
    stored named another order number than the one the provider signed) nor
    refused for its form: it names no payment of ours, the contract's
    `callback_mismatch`."""
    no, txn = payment.order.merchant_order_no, payment.provider_txn_id
    [(name, value)] = override.items()
    response = post_callback(
        event_body(payment, **{name: value.format(no=no, txn=txn)})
    )
    assert_problem(response, 400, "callback_mismatch")
    assert not ProviderEvent.objects.exists()


def test_an_event_id_is_the_providers_own_taken_as_sent(payment):
    """The provider names its events as it likes: one whose id has spaces around
    it is acknowledged and stored as sent (refused, a signed success would be
    redelivered and refused for ever; trimmed, it would be taken for another
    event)."""
    assert post_callback(event_body(payment, event_id=" evt-1 ")).status_code == 200
    assert list(ProviderEvent.objects.values_list("event_id", flat=True)) == [" evt-1 "]
    process_all()
    payment.refresh_from_db()
    assert payment.status == Payment.Status.SUCCEEDED


def test_the_invariant_names_a_settled_payment_without_its_entry(payment):
    post_callback(event_body(payment))
    process_all()
    assert "payments_match_the_ledger" in ledger_report()["checks"]
    Payment.objects.filter(pk=payment.pk).update(journal_entry=None)
    report = ledger_report()
    assert (
        f"payment {payment.pk} is succeeded but names no journal entry"
        in (report["violations"])
    )


def test_the_shipment_is_dispatched_once(payment):
    post_callback(event_body(payment))
    process_all()
    shipment = Shipment.objects.get()
    assert shipment_dispatch(shipment_id=shipment.pk) is True
    assert shipment_dispatch(shipment_id=shipment.pk) is False


@pytest.mark.django_db(transaction=True)
def test_racing_deliveries_of_one_event_store_it_once(on_postgres):
    user, _, _ = customer("dora")
    payment = pending_provider_payment(place_order(user, amount=700))
    body = event_body(payment)
    statuses = run_in_threads(6, lambda i: post_callback(body).status_code)
    assert statuses == [200] * 6
    assert ProviderEvent.objects.count() == 1
    results = run_in_threads(
        4,
        lambda i: (
            provider_event_process(event_id=ProviderEvent.objects.get().pk).status
        ),
    )
    assert results == ["processed"] * 4, results
    assert_settled_once(payment)
    connection.close()


@pytest.mark.django_db(transaction=True)
def test_racing_different_success_events_settle_once(on_postgres):
    user, _, _ = customer("emma")
    payment = pending_provider_payment(place_order(user, amount=900))
    for _ in range(5):
        assert post_callback(event_body(payment)).status_code == 200
    ids = list(ProviderEvent.objects.values_list("pk", flat=True))
    results = run_in_threads(
        5, lambda i: provider_event_process(event_id=ids[i]).status
    )
    assert results == ["processed"] * 5, results
    assert_settled_once(payment)


@pytest.mark.parametrize(
    "content_type",
    [
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=xyz",
        "text/plain",
        "",
    ],
)
def test_odd_content_types_never_500(payment, content_type, settings):
    body = raw(event_body(payment))
    header = sign(secret=settings.PAYMENT_PROVIDER_SECRET, body=body)
    response = APIClient().generic(
        "POST",
        "/api/v1/payments/callback",
        body,
        content_type=content_type,
        headers={"X-Provider-Signature": header},
    )
    assert response.status_code in (200, 400), response.content


def test_any_printable_nonce_and_upper_case_hex_are_accepted(payment, settings):
    body = raw(event_body(payment))
    header = sign(secret=settings.PAYMENT_PROVIDER_SECRET, body=body, nonce="a+/=Z")
    t, n, v1 = header.split(",")
    upper = f"{t},{n},{v1.upper().replace('V1=', 'v1=')}"
    assert post_callback(body, header=upper).status_code == 200
    assert ProviderEvent.objects.count() == 1
    assert_problem(
        post_callback(body, header=header), 401, "callback_signature_invalid"
    )


@pytest.mark.django_db(transaction=True)
def test_two_nonce_purges_at_once_while_callbacks_arrive_and_replay(
    on_postgres, settings
):
    """Beat's nonce purge sent twice at once while fresh callbacks claim nonces and
    replays of live ones are refused: the expired nonces go once, no live one goes
    (its replay is still refused), no errors."""
    from datetime import timedelta

    from django.utils import timezone

    from payments.exceptions import CallbackSignatureInvalid
    from payments.signatures import signature_verify
    from payments.tasks import purge_expired_nonces

    secret = settings.PAYMENT_PROVIDER_SECRET
    CallbackNonce.objects.bulk_create(
        CallbackNonce(nonce=f"old-{i}", expires_at=timezone.now() - timedelta(hours=1))
        for i in range(1500)
    )
    body = b'{"event": "test"}'
    seen = [sign(secret=secret, body=body, nonce=f"seen-{i}") for i in range(20)]
    for header in seen:
        signature_verify(header=header, body=body, secret=secret)

    def verify(header: str):
        try:
            signature_verify(header=header, body=body, secret=secret)
        except CallbackSignatureInvalid as refused:
            return str(refused)
        return "accepted"

    def work(i: int):
        if i < 2:
            return purge_expired_nonces()
        if i == 2:
            return [verify(header) for header in seen]
        return [
            verify(sign(secret=secret, body=body, nonce=f"new-{n}")) for n in range(20)
        ]

    purged_a, purged_b, replays, fresh = run_in_threads(4, work)

    assert purged_a + purged_b == 1500, (purged_a, purged_b)
    assert replays == ["This signature's nonce was already used."] * 20
    assert fresh == ["accepted"] * 20
    left = set(CallbackNonce.objects.values_list("nonce", flat=True))
    assert left == {f"seen-{i}" for i in range(20)} | {f"new-{i}" for i in range(20)}
