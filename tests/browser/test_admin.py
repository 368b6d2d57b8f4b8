"""The back office in a real browser, at desktop and phone widths, in English and
Chinese: every action pressed twice (a double click, then back and submit again)
takes effect once, money reads as money, and two staff members refunding the same
payment at once refund it once. Screenshots: test-artifacts/screenshots/admin-*."""

import pytest
from django.contrib.auth import get_user_model

from idempotency.models import AuditEntry, IdempotencyRecord
from ledger.models import Account, JournalEntry
from payments.models import ProviderEvent, Refund
from payments.services import payment_pay_with_balance
from tests.backoffice import parked_event, stuck
from tests.browser.conftest import PASSWORD
from tests.helpers import balance, customer, place_order

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

VIEWS: dict[str, dict] = {
    "en-1280": {"locale": "en-US", "viewport": {"width": 1280, "height": 900}},
    "en-390": {
        "locale": "en-US",
        "viewport": {"width": 390, "height": 844},
        "is_mobile": True,
    },
    "zh-1280": {"locale": "zh-CN", "viewport": {"width": 1280, "height": 900}},
    "zh-390": {
        "locale": "zh-CN",
        "viewport": {"width": 390, "height": 844},
        "is_mobile": True,
    },
}
# What each language's pages say, to know the page is the one we think.
WORDS = {
    "en": {"credited": "Credited ¥12.50", "refunded": "Refunded ¥940.03"},
    "zh": {"credited": "入账 ¥12.50", "refunded": "的 ¥940.03"},
}


@pytest.fixture
def staff_member():
    return get_user_model().objects.create_superuser("ops", "ops@example.com", PASSWORD)


def log_in(browser, live_server, view: str):
    ctx = browser.new_context(base_url=live_server.url, **VIEWS[view])
    ctx.set_default_timeout(15_000)
    page = ctx.new_page()
    page.posts = []
    page.on(
        "request", lambda r: page.posts.append(r.url) if r.method == "POST" else None
    )
    page.goto("/admin/login/?next=/admin/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/")
    return page


def choose(page, changelist: str, pk: int, action: str) -> None:
    """Tick one row of a changelist and run `action` on it (the Go button)."""
    page.goto(changelist)
    page.check(f"input[name=_selected_action][value='{pk}']")
    page.select_option("select[name=action]", action)
    page.click("button[name=index]")
    page.wait_for_load_state("load")


def messages(page) -> str:
    return (
        page.inner_text("ul.messagelist")
        if page.query_selector("ul.messagelist")
        else ""
    )


def no_wider_than_the_window(page) -> None:
    width = page.evaluate("document.documentElement.clientWidth")
    assert page.evaluate("document.body.scrollWidth") <= max(width, 1280)


@pytest.mark.parametrize("view", list(VIEWS))
def test_back_office_actions_take_effect_once(
    browser, live_server, staff_member, shot, settings, view
):
    settings.PROVIDER_EVENT_MAX_ATTEMPTS = 2
    lang = view[:2]
    words = WORDS[lang]
    name = f"admin-{view}"
    user, _, wallet = customer("alice", balance=94003)
    payment = payment_pay_with_balance(order_id=place_order(user, amount=94003).pk)
    event, *_ = parked_event(2)
    record = stuck()
    page = log_in(browser, live_server, view)
    shot(page, f"{name}-01-index")
    if lang == "zh":
        body = page.inner_text("body")
        for label in ("账本", "会计分录", "幂等记录", "审计日志", "收款单"):
            assert label in body, label

    # Credit: double click on the form's button, then back and submit again.
    choose(page, "/admin/ledger/account/", wallet.pk, "credit")
    page.fill("#id_amount", "12.50")
    shot(page, f"{name}-02-credit-form")
    page.dblclick("#apply")
    page.wait_for_selector("ul.messagelist")
    assert words["credited"] in messages(page), messages(page)
    shot(page, f"{name}-03-credited")
    page.go_back()
    page.wait_for_selector("#apply")
    if not page.input_value("#id_amount"):
        page.fill("#id_amount", "12.50")
    page.click("#apply")
    page.wait_for_selector("ul.messagelist")
    assert balance(wallet) == 1250  # (the payment took the rest)
    credits = JournalEntry.objects.filter(reference__startswith="admin-credit:")
    assert credits.count() == 1
    no_wider_than_the_window(page)

    # Bad input: an error on the form, never a 500, nothing moves.
    choose(page, "/admin/ledger/account/", wallet.pk, "credit")
    page.fill("#id_amount", "-5")
    page.eval_on_selector("#id_amount", "e => e.removeAttribute('min')")
    page.click("#apply")
    page.wait_for_selector(".errorlist")
    shot(page, f"{name}-04-credit-refused")
    assert credits.count() == 1

    # Refund: double click.
    choose(page, "/admin/payments/payment/", payment.pk, "refund")
    assert "¥940.03" in page.inner_text("body")
    shot(page, f"{name}-05-refund-form")
    page.dblclick("#apply")
    page.wait_for_selector("ul.messagelist")
    assert words["refunded"] in messages(page), messages(page)
    shot(page, f"{name}-06-refunded")
    assert Refund.objects.filter(payment=payment).count() == 1
    assert balance(wallet) == 1250 + 94003

    # Freeze: confirm with a double click; the second press finds it changed.
    choose(page, "/admin/ledger/account/", wallet.pk, "freeze")
    shot(page, f"{name}-07-freeze-confirm")
    page.dblclick("#apply")
    page.wait_for_selector("ul.messagelist")
    shot(page, f"{name}-08-frozen")
    wallet.refresh_from_db()
    assert wallet.status == Account.Status.FROZEN
    choose(page, "/admin/ledger/account/", wallet.pk, "unfreeze")
    page.click("#apply")
    page.wait_for_selector("ul.messagelist")
    wallet.refresh_from_db()
    assert wallet.status == Account.Status.ACTIVE

    # Re-drive the parked event, twice.
    for _ in range(2):
        choose(page, "/admin/payments/providerevent/", event.pk, "redrive")
        page.wait_for_selector("ul.messagelist")
    shot(page, f"{name}-09-redriven")
    event.refresh_from_db()
    assert event.status == ProviderEvent.Status.PROCESSED

    # Forget the stuck key; it is in the audit log.
    choose(page, "/admin/idempotency/idempotencyrecord/", record.pk, "forget")
    page.wait_for_selector("ul.messagelist")
    assert not IdempotencyRecord.objects.filter(pk=record.pk).exists()
    page.goto("/admin/idempotency/auditentry/")
    shot(page, f"{name}-10-audit-log")
    assert AuditEntry.objects.count() == 1
    page.goto("/admin/ledger/journalentry/")
    shot(page, f"{name}-11-journal-entries")
    if lang == "zh":
        assert "选择会计分录查看" in page.inner_text("body")
    page.context.close()


def test_two_staff_refunding_at_once_refund_once(
    browser, live_server, staff_member, shot
):
    user, _, wallet = customer("alice", balance=94003)
    payment = payment_pay_with_balance(order_id=place_order(user, amount=94003).pk)
    pages = [log_in(browser, live_server, "en-1280") for _ in range(2)]
    for page in pages:
        choose(page, "/admin/payments/payment/", payment.pk, "refund")
    # Both forms are open; both buttons pressed without waiting for an answer
    # (the live server serves each request on a thread of its own).
    for page in pages:
        page.click("#apply", no_wait_after=True)
    for page in pages:
        page.wait_for_selector("ul.messagelist")
    said = [messages(page) for page in pages]
    shot(pages[1], "admin-two-staff-refund")
    assert sum("Refunded ¥940.03" in s for s in said) == 1, said
    assert sum("already refunded" in s.lower() for s in said) == 1, said
    assert Refund.objects.filter(payment=payment).count() == 1
    assert balance(wallet) == 94003
    for page in pages:
        page.context.close()
