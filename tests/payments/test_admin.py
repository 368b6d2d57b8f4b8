"""The back office's payment actions: refund a payment (the API's service, from a
form with a one-time token) and re-drive a parked provider event. Each takes effect
once however often its button is pressed, and from two browsers at once."""

import pytest
from django.db import connection

from ledger.models import JournalEntry
from orders.models import Order
from payments.models import Payment, ProviderEvent, Refund
from payments.services import payment_pay_with_balance, payment_refund
from tests.backoffice import (
    apply_action,
    messages_of,
    open_action,
    parked_event,
    staff,
    token_of,
)
from tests.conftest import run_in_threads
from tests.factories import ChargeFactory
from tests.helpers import (
    balance,
    customer,
    pending_provider_payment,
    place_order,
)

pytestmark = pytest.mark.django_db

PAYMENTS = "/admin/payments/payment/"
EVENTS = "/admin/payments/providerevent/"


@pytest.fixture
def paid():
    """A payment of ¥940.03 from alice's wallet, which is then empty."""
    user, _, wallet = customer("alice", balance=94003)
    order = place_order(user, amount=94003)
    return payment_pay_with_balance(order_id=order.pk), wallet


def refund(client, payment, token, reason="damaged in transit"):
    return apply_action(
        client, PAYMENTS, "refund", [payment.pk], token=token, reason=reason
    )


def assert_refunded_once(payment, wallet) -> None:
    payment.refresh_from_db()
    assert payment.status == Payment.Status.REFUNDED
    assert payment.order.__class__.objects.get(pk=payment.order_id).status == (
        Order.Status.REFUNDED
    )
    assert Refund.objects.filter(payment=payment).count() == 1
    assert JournalEntry.objects.filter(kind=JournalEntry.Kind.REFUND).count() == 1
    assert balance(wallet) == 94003


def test_money_is_shown_with_its_currency_on_every_page(admin_client, paid):
    payment, _ = paid
    charge = ChargeFactory(amount=94003)
    urls = [
        "/admin/orders/order/",
        f"/admin/orders/order/{payment.order_id}/change/",
        PAYMENTS,
        f"{PAYMENTS}{payment.pk}/change/",
        "/admin/provider_sim/charge/",
        f"/admin/provider_sim/charge/{charge.pk}/change/",
    ]
    for url in urls:
        content = admin_client.get(url).content.decode()
        assert "¥940.03" in content, url
        assert ">94003<" not in content, url


def test_transitions_and_titles_read_in_chinese(admin_client, paid):
    payment, _ = paid
    place_order(payment.order.owner)
    orders = admin_client.get("/admin/orders/order/", HTTP_ACCEPT_LANGUAGE="zh-hans")
    content = orders.content.decode()
    assert "取消, 支付" in content or "支付, 取消" in content
    assert "cancel, pay" not in content
    entries = admin_client.get(
        "/admin/ledger/journalentry/", HTTP_ACCEPT_LANGUAGE="zh-hans"
    ).content.decode()
    assert "选择会计分录查看" in entries or "选择 会计分录 查看" in entries, entries[
        :300
    ]
    index = admin_client.get("/admin/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    for label in (
        "账本",
        "幂等记录",
        "会计分录",
        "过账记录",
        "收款单",
        "通知",
        "审计日志",
    ):
        assert label in index, label


def test_records_are_named_in_chinese(admin_client, paid):
    """What a page names a record by (an inline's row, a breadcrumb, the refund
    page's list, a checkbox's title) is in the reader's language too."""
    payment, wallet = paid
    payment_refund(payment_id=payment.pk)
    payment.refresh_from_db()
    zh = {"HTTP_ACCEPT_LANGUAGE": "zh-hans"}
    entry = payment.journal_entry
    pages = {
        f"/admin/orders/order/{payment.order.pk}/change/": [
            f"支付 {payment.pk}（钱包余额，已退款）"  # noqa: RUF001
        ],
        f"/admin/payments/shipment/{payment.order.shipment.pk}/change/": [
            f"订单 {payment.order.pk} 的发货（已取消）"  # noqa: RUF001
        ],
        PAYMENTS: [f"支付 {payment.pk}（钱包余额，已退款）"],  # noqa: RUF001
        f"/admin/ledger/journalentry/{entry.pk}/change/": [
            f"支付 {entry.reference}",
            f"账户 {wallet.pk}：-94003",  # noqa: RUF001
        ],
        f"/admin/payments/refund/{payment.refund_record.pk}/change/": [
            f"支付 {payment.pk} 的退款 {payment.refund_record.pk}"
        ],
    }
    for url, names in pages.items():
        content = admin_client.get(url, **zh).content.decode()
        for name in names:
            assert name in content, (url, name)
        for english in (
            f"payment {payment.pk} (",
            "shipment of",
            "on account",
            "of payment",
        ):
            assert english not in content, (url, english)
    add = admin_client.get("/admin/orders/product/add/", **zh).content.decode()
    assert "Currency" not in add and "币种" in add


def test_actions_without_a_page_have_no_action_page(admin_client, paid):
    # Capture and void act at once from the list: their page's address names
    # nothing (it once answered 500).
    payment, _ = paid
    for action in ("capture", "void"):
        url = f"{PAYMENTS}backoffice/{action}/?ids={payment.pk}&token={'a' * 32}"
        assert admin_client.get(url).status_code == 404, action
    assert Payment.objects.get().status == payment.status


def test_refund_gives_the_money_back_once(admin_client, paid):
    payment, wallet = paid
    page = open_action(admin_client, PAYMENTS, "refund", [payment.pk])
    assert page.status_code == 200
    assert "¥940.03" in page.content.decode()
    response = refund(admin_client, payment, token_of(page))
    assert response.status_code == 200
    assert_refunded_once(payment, wallet)
    assert Refund.objects.get().reason == "damaged in transit"
    assert any("Refunded ¥940.03" in m for m in messages_of(response))


def test_refund_pressed_twice_refunds_once(admin_client, paid):
    payment, wallet = paid
    token = token_of(open_action(admin_client, PAYMENTS, "refund", [payment.pk]))
    refund(admin_client, payment, token)
    again = refund(admin_client, payment, token)
    assert_refunded_once(payment, wallet)
    assert any("done once" in m for m in messages_of(again)), messages_of(again)
    # A second form for a refunded payment: refused by the service, with a message.
    fresh = token_of(open_action(admin_client, PAYMENTS, "refund", [payment.pk]))
    response = refund(admin_client, payment, fresh)
    assert response.status_code == 200
    assert any("already refunded" in m.lower() for m in messages_of(response))
    assert_refunded_once(payment, wallet)


@pytest.mark.django_db(transaction=True)
def test_refund_from_two_browsers_at_once_refunds_once(admin_user, on_postgres):
    user, _, wallet = customer("alice", balance=94003)
    payment = payment_pay_with_balance(order_id=place_order(user, amount=94003).pk)
    token = token_of(open_action(staff(admin_user), PAYMENTS, "refund", [payment.pk]))
    results = run_in_threads(
        2, lambda i: messages_of(refund(staff(admin_user), payment, token))
    )
    assert_refunded_once(payment, wallet)
    shown = [m for messages in results for m in messages]
    assert sum("Refunded ¥940.03" in m for m in shown) == 2, shown  # the same answer
    connection.close()


@pytest.mark.django_db(transaction=True)
def test_two_refund_forms_at_once_refund_once(admin_user, on_postgres):
    """Two staff members, each with a form of their own: the service refunds once."""
    user, _, wallet = customer("alice", balance=94003)
    payment = payment_pay_with_balance(order_id=place_order(user, amount=94003).pk)
    tokens = [
        token_of(open_action(staff(admin_user), PAYMENTS, "refund", [payment.pk]))
        for _ in range(2)
    ]
    results = run_in_threads(
        2, lambda i: messages_of(refund(staff(admin_user), payment, tokens[i]))
    )
    assert_refunded_once(payment, wallet)
    shown = [m for messages in results for m in messages]
    assert sum("Refunded" in m for m in shown) == 1, shown
    assert sum("already refunded" in m.lower() for m in shown) == 1, shown
    connection.close()


@pytest.mark.parametrize("reason", ["", "x" * 65])
def test_refund_refuses_bad_input_with_a_message(admin_client, paid, reason):
    payment, _ = paid
    token = token_of(open_action(admin_client, PAYMENTS, "refund", [payment.pk]))
    response = refund(admin_client, payment, token, reason=reason)
    assert response.status_code == 400
    assert 'class="errorlist' in response.content.decode()
    payment.refresh_from_db()
    assert payment.status == Payment.Status.SUCCEEDED
    assert not Refund.objects.exists()


def test_refund_refuses_a_pending_payment_with_a_message(admin_client):
    user, _, _ = customer("alice")
    payment = pending_provider_payment(place_order(user))
    token = token_of(open_action(admin_client, PAYMENTS, "refund", [payment.pk]))
    response = refund(admin_client, payment, token)
    assert response.status_code == 200
    assert any("Only a succeeded payment" in m for m in messages_of(response))
    assert not Refund.objects.exists()


def redrive(client, event):
    return client.post(
        EVENTS, {"action": "redrive", "_selected_action": [event.pk]}, follow=True
    )


def assert_redriven_once(event, payment) -> None:
    event.refresh_from_db()
    payment.refresh_from_db()
    assert event.status == ProviderEvent.Status.PROCESSED
    assert payment.status == Payment.Status.REFUNDED  # the late success given back
    assert Refund.objects.filter(payment=payment).count() == 1
    assert JournalEntry.objects.filter(reference=f"provider:{payment.pk}").count() == 1


def test_redrive_processes_a_parked_event_once(admin_client, settings):
    settings.PROVIDER_EVENT_MAX_ATTEMPTS = 2
    event, payment, _ = parked_event(2)
    response = redrive(admin_client, event)
    assert response.status_code == 200
    assert_redriven_once(event, payment)
    assert any("1 processed" in m for m in messages_of(response))
    again = redrive(admin_client, event)
    assert any("1 skipped (not parked)" in m for m in messages_of(again))
    assert_redriven_once(event, payment)


@pytest.mark.django_db(transaction=True)
def test_redrive_from_two_browsers_at_once_processes_once(
    admin_user, settings, on_postgres
):
    settings.PROVIDER_EVENT_MAX_ATTEMPTS = 2
    event, payment, _ = parked_event(2)
    results = run_in_threads(
        2, lambda i: messages_of(redrive(staff(admin_user), event))
    )
    assert_redriven_once(event, payment)
    shown = [m for messages in results for m in messages]
    assert sum("1 processed" in m for m in shown) == 1, shown
    assert sum("1 skipped" in m for m in shown) == 1, shown
    connection.close()
