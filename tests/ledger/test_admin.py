"""The back office's ledger actions: credit a customer, freeze and unfreeze an
account. Each is the service the rest of the project uses, and each takes effect
once however often its button is pressed, and from two browsers at once."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from ledger.models import Account, JournalEntry
from ledger.services import (
    account_close,
    account_freeze,
    account_unfreeze,
    hold_authorize,
    ledger_transfer,
    merchant_account,
)
from tests.backoffice import apply_action, messages_of, open_action, staff, token_of
from tests.conftest import run_in_threads
from tests.helpers import balance, customer

pytestmark = pytest.mark.django_db

ACCOUNTS = "/admin/ledger/account/"


def credits(account: Account) -> int:
    return JournalEntry.objects.filter(
        kind=JournalEntry.Kind.DEPOSIT, reference__startswith="admin-credit:"
    ).count()


def credit(client, wallet, token, amount="12.50", **extra):
    return apply_action(
        client, ACCOUNTS, "credit", [wallet.pk], token=token, amount=amount, **extra
    )


def test_money_is_shown_with_its_currency(admin_client):
    _, _, wallet = customer("alice", balance=94003)
    page = admin_client.get(ACCOUNTS).content.decode()
    assert "¥940.03" in page
    assert "94003" not in page
    entry = JournalEntry.objects.get()
    for url in (
        f"{ACCOUNTS}{wallet.pk}/change/",
        "/admin/ledger/journalentry/",
        f"/admin/ledger/journalentry/{entry.pk}/change/",
        "/admin/ledger/posting/",
        f"/admin/ledger/posting/{entry.postings.first().pk}/change/",
    ):
        content = admin_client.get(url).content.decode()
        assert "¥940.03" in content, url


def test_accounts_are_read_only_in_the_admin(admin_client):
    """No add form (a code or currency of the ledger's own accounts, made by hand,
    took payments meant for them) and no Save (it wrote back the balance the page
    had read while payments moved it); the actions still work."""
    _, _, wallet = customer("alice", balance=1000)
    url = f"{ACCOUNTS}{wallet.pk}/change/"
    page = admin_client.get(url)
    assert page.status_code == 200 and b'name="_save"' not in page.content
    assert admin_client.post(url, {"code": "merchant-cny"}).status_code == 403
    form = {"code": "merchant-eur", "kind": "wallet", "currency": "EUR"}
    assert admin_client.get(f"{ACCOUNTS}add/").status_code == 403
    assert admin_client.post(f"{ACCOUNTS}add/", form).status_code == 403
    assert not Account.objects.filter(code="merchant-eur").exists()
    assert balance(wallet) == 1000
    assert open_action(admin_client, ACCOUNTS, "credit", [wallet.pk]).status_code == 200


def test_an_action_on_more_than_a_page_holds_says_so(admin_client, monkeypatch):
    from ledger.admin import AccountAdmin

    monkeypatch.setattr(AccountAdmin, "MAX_OBJECTS", 2)
    wallets = [customer(name)[2] for name in ("alice", "bob", "carol")]
    page = open_action(admin_client, ACCOUNTS, "freeze", [w.pk for w in wallets])
    assert any(
        "Only the first 2 of the 3 selected are on this page" in m
        for m in messages_of(page)
    ), messages_of(page)
    assert f'name="status_{wallets[2].pk}"' not in page.content.decode()


def test_credit_deposits_once(admin_client):
    _, _, wallet = customer("alice", balance=1000)
    page = open_action(admin_client, ACCOUNTS, "credit", [wallet.pk])
    assert page.status_code == 200
    token = token_of(page)
    response = credit(admin_client, wallet, token, description="Goodwill")
    assert response.status_code == 200
    assert balance(wallet) == 1000 + 1250
    entry = JournalEntry.objects.get(reference__startswith="admin-credit:")
    assert entry.kind == JournalEntry.Kind.DEPOSIT
    assert entry.description == "Goodwill"
    assert any("Credited ¥12.50" in m for m in messages_of(response))


def test_credit_pressed_twice_or_resubmitted_credits_once(admin_client):
    _, _, wallet = customer("alice")
    page = open_action(admin_client, ACCOUNTS, "credit", [wallet.pk])
    token = token_of(page)
    # The page names its token: the back button, or a reload, shows the same form.
    url = page.redirect_chain[-1][0]
    assert f"token={token}" in url
    assert token_of(admin_client.get(url)) == token
    credit(admin_client, wallet, token)
    again = credit(admin_client, wallet, token)  # double click, back and resubmit
    assert balance(wallet) == 1250
    assert credits(wallet) == 1
    assert any("done once" in m for m in messages_of(again)), messages_of(again)
    # Resubmitted after switching the admin's language: the same operation still.
    admin_client.defaults["HTTP_ACCEPT_LANGUAGE"] = "zh-hans"
    switched = credit(admin_client, wallet, token)
    del admin_client.defaults["HTTP_ACCEPT_LANGUAGE"]
    assert credits(wallet) == 1 and balance(wallet) == 1250
    assert any("只执行了一次" in m for m in messages_of(switched)), messages_of(
        switched
    )
    # Back, change the amount, submit the same form again: refused, nothing moves.
    changed = credit(admin_client, wallet, token, amount="99")
    assert balance(wallet) == 1250
    assert any("already submitted" in m for m in messages_of(changed))
    # A new form is a new intention.
    credit(
        admin_client,
        wallet,
        token_of(open_action(admin_client, ACCOUNTS, "credit", [wallet.pk])),
    )
    assert balance(wallet) == 2500


@pytest.mark.django_db(transaction=True)
def test_credit_from_two_browsers_at_once_credits_once(admin_user, on_postgres):
    _, _, wallet = customer("alice")
    token = token_of(open_action(staff(admin_user), ACCOUNTS, "credit", [wallet.pk]))
    results = run_in_threads(
        2, lambda i: credit(staff(admin_user), wallet, token).status_code
    )
    assert results == [200, 200]
    assert balance(wallet) == 1250
    assert credits(wallet) == 1
    connection.close()


@pytest.mark.parametrize(
    "amount",
    ["-5", "0", "0.001", "1e20", "99999999999999999", "abc", "", "NaN", "1e3", "1_0"],
)
def test_credit_refuses_bad_amounts_with_a_message(admin_client, amount):
    _, _, wallet = customer("alice")
    token = token_of(open_action(admin_client, ACCOUNTS, "credit", [wallet.pk]))
    response = credit(admin_client, wallet, token, amount=amount)
    assert response.status_code == 400
    assert response.context["form"].errors["amount"]
    assert 'class="errorlist' in response.content.decode()
    assert balance(wallet) == 0
    assert credits(wallet) == 0


@pytest.mark.parametrize("amount", ["-5", "-12.50", "0"])
def test_credit_below_the_minimum_says_so(admin_client, amount):
    _, _, wallet = customer("alice")
    token = token_of(open_action(admin_client, ACCOUNTS, "credit", [wallet.pk]))
    response = credit(admin_client, wallet, token, amount=amount)
    assert response.status_code == 400
    assert response.context["form"].errors["amount"] == [
        "Ensure this value is greater than or equal to 0.01."
    ]
    assert credits(wallet) == 0


def test_credit_refuses_a_damaged_token(admin_client):
    _, _, wallet = customer("alice")
    response = credit(admin_client, wallet, "../../etc/passwd")
    assert response.status_code == 400
    assert "This form is damaged; open it again." in response.content.decode()
    assert balance(wallet) == 0


def test_credit_refuses_a_token_the_server_did_not_issue(admin_client):
    """A token of the right shape that was never issued (one digit changed, or made
    up) names no operation the page offered: refused, not a second deposit."""
    _, _, wallet = customer("alice")
    token = token_of(open_action(admin_client, ACCOUNTS, "credit", [wallet.pk]))
    assert credit(admin_client, wallet, token, amount="5").status_code == 200
    flipped = token[:-1] + ("0" if token[-1] != "0" else "1")
    nonce = ("0" if token[0] != "0" else "1") + token[1:]
    for forged in (flipped, nonce, "0" * 32, "a" * 32):
        response = credit(admin_client, wallet, forged, amount="5")
        assert response.status_code == 400, forged
        assert "This form is damaged; open it again." in response.content.decode()
    assert balance(wallet) == 500
    assert credits(wallet) == 1


def test_a_form_opened_before_the_secret_key_was_rotated_submits_once(
    admin_client, settings
):
    """DJANGO_SECRET_KEY replaced, the old key in DJANGO_SECRET_KEY_FALLBACKS: a
    form staff opened before still submits (and its retry is the same operation);
    once the old key is dropped, such a form is refused as damaged."""
    _, _, wallet = customer("alice")
    first, second = (
        token_of(open_action(admin_client, ACCOUNTS, "credit", [wallet.pk]))
        for _ in range(2)
    )
    old = settings.SECRET_KEY
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = f"rotated-{old}", [old]
    assert credit(admin_client, wallet, first).status_code == 200
    assert credit(admin_client, wallet, first).status_code == 200
    assert (balance(wallet), credits(wallet)) == (1250, 1)
    settings.SECRET_KEY_FALLBACKS = []
    response = credit(admin_client, wallet, second)
    assert response.status_code == 400
    assert "This form is damaged; open it again." in response.content.decode()
    assert (balance(wallet), credits(wallet)) == (1250, 1)


def test_credit_refuses_what_is_not_a_customer_wallet(admin_client):
    _, _, wallet = customer("alice")
    merchant = merchant_account(currency="CNY")
    account_close(account_id=wallet.pk)
    token = token_of(open_action(admin_client, ACCOUNTS, "credit", [merchant.pk]))
    response = apply_action(
        admin_client,
        ACCOUNTS,
        "credit",
        [merchant.pk, wallet.pk],
        token=token,
        amount="5",
    )
    assert response.status_code == 200
    shown = messages_of(response)
    assert any("Only a customer's wallet" in m for m in shown), shown
    assert any("not active" in m for m in shown), shown
    assert credits(wallet) == 0


def test_credit_page_in_chinese(admin_client):
    _, _, wallet = customer("alice")
    page = admin_client.post(
        ACCOUNTS,
        {"action": "credit", "_selected_action": [wallet.pk]},
        HTTP_ACCEPT_LANGUAGE="zh-hans",
        follow=True,
    )
    content = page.content.decode()
    assert "给客户入账" in content
    assert "金额" in content


def freeze(client, account, seen, action="freeze"):
    """Press the confirmation as shown when the account had taken `seen`
    transitions (its `status_version`)."""
    return apply_action(
        client, ACCOUNTS, action, [account.pk], **{f"status_{account.pk}": seen}
    )


def test_freeze_and_unfreeze_take_the_status_shown(admin_client):
    _, _, wallet = customer("alice", balance=100)
    wallet.refresh_from_db()
    page = open_action(admin_client, ACCOUNTS, "freeze", [wallet.pk])
    assert page.status_code == 200
    assert f'name="status_{wallet.pk}" value="0"' in page.content.decode()
    response = freeze(admin_client, wallet, 0)
    wallet.refresh_from_db()
    assert wallet.status == Account.Status.FROZEN
    assert any("now Frozen" in m for m in messages_of(response))
    response = freeze(admin_client, wallet, 1, action="unfreeze")
    wallet.refresh_from_db()
    assert wallet.status == Account.Status.ACTIVE
    assert any("now Active" in m for m in messages_of(response))


def test_unfreeze_pressed_twice_unfreezes_once(admin_client):
    _, _, wallet = customer("alice")
    account_freeze(account_id=wallet.pk)
    wallet.refresh_from_db()
    seen = wallet.version
    freeze(admin_client, wallet, 1, action="unfreeze")
    again = freeze(admin_client, wallet, 1, action="unfreeze")
    wallet.refresh_from_db()
    assert (wallet.status, wallet.version) == (Account.Status.ACTIVE, seen + 1)
    assert any("changed since you looked" in m for m in messages_of(again))


def test_freeze_pressed_twice_freezes_once(admin_client):
    _, _, wallet = customer("alice")
    wallet.refresh_from_db()
    seen = wallet.version
    freeze(admin_client, wallet, 0)
    again = freeze(admin_client, wallet, 0)
    wallet.refresh_from_db()
    assert (wallet.status, wallet.version) == (Account.Status.FROZEN, seen + 1)
    assert any("changed since you looked" in m for m in messages_of(again))
    # Freezing a frozen account, even one shown frozen, changes nothing.
    third = freeze(admin_client, wallet, 1)
    wallet.refresh_from_db()
    assert wallet.version == seen + 1
    assert any("not changed" in m for m in messages_of(third))


@pytest.mark.django_db(transaction=True)
def test_freeze_from_two_browsers_at_once_freezes_once(admin_user, on_postgres):
    _, _, wallet = customer("alice")
    wallet.refresh_from_db()
    seen = wallet.version
    results = run_in_threads(
        2, lambda i: messages_of(freeze(staff(admin_user), wallet, 0))
    )
    wallet.refresh_from_db()
    assert (wallet.status, wallet.version) == (Account.Status.FROZEN, seen + 1)
    shown = [m for messages in results for m in messages]
    assert sum("now Frozen" in m for m in shown) == 1, shown
    assert sum("changed since you looked" in m for m in shown) == 1, shown
    connection.close()


def test_freeze_applies_though_money_moved_since_the_page_was_shown(admin_client):
    """Every posting bumps the version: an account in use (a merchant taking
    payments, a wallet being drained) could never be frozen if that had to hold
    still between the page and the press. Only its status has to."""
    _, _, wallet = customer("alice", balance=100)
    _, _, bob = customer("bob")
    open_action(admin_client, ACCOUNTS, "freeze", [wallet.pk])
    ledger_transfer(
        source_id=wallet.pk,
        destination_id=bob.pk,
        amount=30,
        currency="CNY",
        reference="meanwhile",
    )
    response = freeze(admin_client, wallet, 0)
    wallet.refresh_from_db()
    assert wallet.status == Account.Status.FROZEN and wallet.balance == 70
    assert any("now Frozen" in m for m in messages_of(response))


def test_a_confirmation_from_before_a_freeze_and_back_changes_nothing(admin_client):
    """Staff A opens "Unfreeze" on a frozen wallet; B unfreezes it, then freezes it
    again (fraud confirmed); A's press must not undo B's second decision."""
    _, _, wallet = customer("alice", balance=100)
    account_freeze(account_id=wallet.pk)
    wallet.refresh_from_db()
    page = open_action(admin_client, ACCOUNTS, "unfreeze", [wallet.pk])
    seen = wallet.status_version
    assert f'name="status_{wallet.pk}" value="{seen}"' in page.content.decode()
    account_unfreeze(account_id=wallet.pk)
    account_freeze(account_id=wallet.pk)
    late = freeze(admin_client, wallet, seen, action="unfreeze")
    wallet.refresh_from_db()
    assert wallet.status == Account.Status.FROZEN
    assert any("changed since you looked" in m for m in messages_of(late))


def test_close_takes_only_an_empty_account_and_says_why_not(admin_client):
    _, _, alice = customer("alice", balance=150)
    _, _, bob = customer("bob")
    response = freeze(admin_client, alice, 0, action="close")
    alice.refresh_from_db()
    assert alice.status == Account.Status.ACTIVE
    shown = messages_of(response)
    assert any(f"account {alice.pk} holds ¥1.50" in m for m in shown), shown
    response = freeze(admin_client, bob, 0, action="close")
    bob.refresh_from_db()
    assert bob.status == Account.Status.CLOSED
    assert any("now Closed" in m for m in messages_of(response))


def test_close_refused_in_chinese_with_the_hold(admin_client):
    _, _, alice = customer("alice", balance=150)
    hold_authorize(
        account_id=alice.pk,
        amount=40,
        reference="hold",
        expires_in=timedelta(hours=1),
    )
    response = freeze(admin_client, alice, 0, action="close")
    assert any(
        f"account {alice.pk} holds ¥1.50 (¥0.40 of it on hold)" in m
        for m in messages_of(response)
    ), messages_of(response)
    admin_client.defaults["HTTP_ACCEPT_LANGUAGE"] = "zh-hans"
    response = freeze(admin_client, alice, 0, action="close")
    shown = messages_of(response)
    said = f"账户 {alice.pk} 仍有 ¥1.50（其中 ¥0.40 已冻结）"  # noqa: RUF001
    assert any(said in m for m in shown), shown


def test_freeze_with_a_damaged_status_shows_the_page_again(admin_client):
    _, _, wallet = customer("alice")
    response = freeze(admin_client, wallet, "not-a-status")
    assert response.status_code == 400
    assert "This form is damaged; open it again." in response.content.decode()
    wallet.refresh_from_db()
    assert wallet.status == Account.Status.ACTIVE


def test_staff_who_may_only_look_at_accounts_can_press_nothing(client):
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    _, _, wallet = customer("alice", balance=100)
    looker = get_user_model().objects.create_user("looker", is_staff=True)
    looker.user_permissions.add(Permission.objects.get(codename="view_account"))
    client.force_login(looker)
    assert client.get(ACCOUNTS).status_code == 200
    for action in ("credit", "freeze", "unfreeze", "close"):
        url = f"{ACCOUNTS}backoffice/{action}/?ids={wallet.pk}&token={'a' * 32}"
        assert client.get(url).status_code == 403, action
        answer = client.post(
            ACCOUNTS, {"action": action, "_selected_action": [wallet.pk]}
        )
        assert answer.status_code != 303, action  # no action page for them
    wallet.refresh_from_db()
    assert (wallet.status, wallet.balance) == (Account.Status.ACTIVE, 100)
    # Allowed to change accounts: the transitions, not yet the credit.
    looker.user_permissions.add(Permission.objects.get(codename="change_account"))
    looker = get_user_model().objects.get(pk=looker.pk)  # (permissions are cached)
    client.force_login(looker)
    assert open_action(client, ACCOUNTS, "freeze", [wallet.pk]).status_code == 200
    url = f"{ACCOUNTS}backoffice/credit/?ids={wallet.pk}&token={'a' * 32}"
    assert client.get(url).status_code == 403


def test_action_pages_need_staff_and_the_action(client, admin_client):
    _, _, wallet = customer("alice")
    url = f"{ACCOUNTS}backoffice/credit/?ids={wallet.pk}&token={'a' * 32}"
    assert client.get(url).status_code == 302  # to the admin's login
    assert admin_client.get(f"{ACCOUNTS}backoffice/nothing/?ids=1").status_code == 403
    # Ids that name nothing (or are not ids) lead back to the list.
    for ids in ("", "abc", "99999999", "1" * 40, "9" * 5000, "\u0661"):
        response = admin_client.get(f"{ACCOUNTS}backoffice/credit/?ids={ids}")
        assert response.status_code == 303, ids
    assert admin_client.put(url).status_code == 405


@pytest.mark.django_db(transaction=True)
def test_a_close_of_busy_accounts_stops_in_time_and_names_the_rest(
    admin_client, monkeypatch, on_postgres
):
    """Each busy account may wait for its lock: one press works through them for a
    bounded time, well inside the server's timeout, and names what it left."""
    import ledger.admin
    import ledger.services
    from tests.helpers import row_locked

    monkeypatch.setattr(ledger.services, "CLOSE_LOCK_SECONDS", 0.3)
    monkeypatch.setattr(ledger.admin, "TRANSITIONS_SECONDS", 0.5)
    wallets = [customer(name)[2] for name in ("ann", "bea", "cy")]
    seen = {f"status_{wallet.pk}": 0 for wallet in wallets}
    selected = [wallet.pk for wallet in wallets]
    with row_locked(Account, wallets[0].pk), row_locked(Account, wallets[1].pk):
        response = apply_action(admin_client, ACCOUNTS, "close", selected, **seen)
    shown = messages_of(response)
    assert sum("is busy" in m for m in shown) == 2, shown
    (left,) = [m for m in shown if "Not reached in time" in m]
    assert str(wallets[2]) in left and str(wallets[0]) not in left
    statuses = Account.objects.filter(pk__in=selected).values_list("status", flat=True)
    assert set(statuses) == {Account.Status.ACTIVE}  # the third one left as it was


def test_staff_who_may_only_look_are_offered_no_action_anywhere(rf):
    """Every action of every admin on the site (the project's, Django's, beat's)
    needs a permission that staff who may only look at everything lack."""
    from django.contrib import admin
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    looker = get_user_model().objects.create_user("looker", is_staff=True)
    looker.user_permissions.set(Permission.objects.filter(codename__startswith="view_"))
    request = rf.get("/admin/")
    request.user = get_user_model().objects.get(pk=looker.pk)
    offered = {
        str(model._meta): sorted(model_admin.get_actions(request))
        for model, model_admin in admin.site._registry.items()
        if model_admin.has_view_permission(request)
    }
    assert "orders.order" in offered and "django_celery_beat.periodictask" in offered
    assert {model: names for model, names in offered.items() if names} == {}


def test_only_what_no_exactly_once_guard_needs_can_be_deleted_in_the_admin(rf):
    """The ledger, orders, pre-orders, payments, idempotency records and their
    audit are each the memory that something happened once: none is deleted from
    the admin, not even by a superuser. Only Django's, tokens' and beat's are."""
    from django.contrib import admin
    from django.contrib.auth import get_user_model

    request = rf.get("/admin/")
    request.user = get_user_model().objects.create_superuser("boss")
    deletable = {
        str(model._meta)
        for model, model_admin in admin.site._registry.items()
        if model_admin.has_delete_permission(request)
        or "delete_selected" in model_admin.get_actions(request)
    }
    apps = {"auth", "authtoken", "django_celery_beat"}
    assert {label for label in deletable if label.split(".")[0] not in apps} == set()


# What a changelist's checkbox never sends back: each made Django's filter raise (a
# 500), now the list's refusal.
DAMAGED_SELECTIONS = ["abc", "1.5", "", "\x00", "1\x00", "1e3", "\u0661", "-1"]


def test_every_action_refuses_a_damaged_selection(admin_client, admin_user, rf):
    from django.contrib import admin
    from django.urls import reverse

    _, _, wallet = customer("alice", balance=100)
    request = rf.get("/admin/")
    request.user = admin_user
    pressed = 0
    for model, model_admin in admin.site._registry.items():
        opts = model._meta
        changelist = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        for action in model_admin.get_actions(request):
            for value in DAMAGED_SELECTIONS:
                answer = admin_client.post(
                    changelist, {"action": action, "_selected_action": [value]}
                )
                assert answer.status_code == 302, (changelist, action, value)
                assert answer["Location"] == changelist, (action, value)
                pressed += 1
    assert pressed > 100
    page = staff(admin_user).post(
        ACCOUNTS,
        {"action": "freeze", "_selected_action": [wallet.pk, "abc"]},
        follow=True,
    )
    assert page.status_code == 200
    assert messages_of(page) == [
        "The selection is damaged: it names something that is not a row of this "
        "list. Nothing was done; select the rows again."
    ]
    wallet.refresh_from_db()
    assert (wallet.status, wallet.balance) == (Account.Status.ACTIVE, 100)


def test_every_model_of_the_project_is_in_the_admin():
    """The contract: `/admin/` shows every model (inlines count: a row shown on
    its parent's page is in the admin too). The worker-id and beat leases and the
    callback nonces once were in none, though the README sent operators there."""
    from django.apps import apps
    from django.contrib import admin

    inlined = {
        inline.model
        for model_admin in admin.site._registry.values()
        for inline in model_admin.inlines
    }
    ours = ("idempotency", "ledger", "orders", "payments", "provider_sim")
    missing = {
        str(model._meta)
        for model in apps.get_models()
        if model._meta.app_label in ours
        and model not in admin.site._registry
        and model not in inlined
    }
    assert missing == set()


def test_leases_and_nonces_are_read_only_in_the_admin(admin_client):
    from idempotency.models import Lease
    from payments.models import CallbackNonce

    now = timezone.now()
    lease = Lease.objects.create(
        name="snowflake:7", holder="host:1:abc", acquired_at=now, expires_at=now
    )
    nonce = CallbackNonce.objects.create(nonce="n-1", expires_at=now)
    for changelist, pk, shown in (
        ("/admin/idempotency/lease/", lease.pk, "host:1:abc"),
        ("/admin/payments/callbacknonce/", nonce.pk, "n-1"),
    ):
        assert shown in admin_client.get(changelist).content.decode()
        page = admin_client.get(f"{changelist}{pk}/change/")
        assert page.status_code == 200
        assert b'name="_save"' not in page.content
        assert admin_client.get(f"{changelist}add/").status_code == 403
        assert admin_client.post(f"{changelist}{pk}/delete/").status_code == 403


@pytest.mark.django_db(transaction=True)
def test_close_and_credit_pressed_at_once_never_close_an_account_with_money(
    admin_user, on_postgres
):
    """One staff member closes an empty wallet while another credits it: either
    the credit lands and the close is refused (the account holds money, or was
    busy with it), or the close lands and the credit is refused (not active).
    Never a closed account holding money, never a page that failed."""
    for _ in range(4):
        _, _, wallet = customer(f"alice-{wallet_count()}")
        wallet.refresh_from_db()
        token = token_of(
            open_action(staff(admin_user), ACCOUNTS, "credit", [wallet.pk])
        )

        def press(i: int, wallet=wallet, token=token):
            if i == 0:
                return messages_of(freeze(staff(admin_user), wallet, 0, action="close"))
            return messages_of(credit(staff(admin_user), wallet, token))

        closing, crediting = run_in_threads(2, press)
        wallet.refresh_from_db()
        if wallet.status == Account.Status.CLOSED:
            assert balance(wallet) == 0
            assert any("now Closed" in m for m in closing), closing
            assert crediting == ["The account is not active; nothing was done."]
        else:
            assert wallet.status == Account.Status.ACTIVE
            assert balance(wallet) == 1250
            assert any("Credited ¥12.50" in m for m in crediting), crediting
            assert any("holds ¥12.50" in m or "is busy" in m for m in closing), closing
    connection.close()


def wallet_count() -> int:
    return Account.objects.filter(kind=Account.Kind.WALLET).count()


@pytest.mark.parametrize("ids", ["99999999", "abc", "-1", "1" * 40, "\u0661", ""])
def test_freeze_pressed_for_ids_that_name_no_account_changes_nothing(admin_client, ids):
    _, _, wallet = customer("alice")
    url = f"{ACCOUNTS}backoffice/freeze/?ids={ids}"
    answer = admin_client.post(url, {f"status_{wallet.pk}": 0, "status_99999999": 0})
    assert answer.status_code == 303  # back to the list, nothing to do
    wallet.refresh_from_db()
    assert (wallet.status, wallet.status_version) == (Account.Status.ACTIVE, 0)


def test_freeze_confirmed_with_another_accounts_status_shows_the_page_again(
    admin_client,
):
    _, _, wallet = customer("alice")
    _, _, other = customer("bob")
    answer = apply_action(
        admin_client, ACCOUNTS, "freeze", [wallet.pk], **{f"status_{other.pk}": 0}
    )
    assert answer.status_code == 400
    for account in (wallet, other):
        account.refresh_from_db()
        assert account.status == Account.Status.ACTIVE
