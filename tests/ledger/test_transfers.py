"""Transfers between customers: one, or a batch of up to 100, all or nothing."""

from datetime import timedelta

import pytest
from django.db.models import Sum
from rest_framework.test import APIClient

from idempotency.models import IdempotencyRecord
from ledger.invariants import ledger_report
from ledger.models import Account, JournalEntry, Posting, Transfer
from ledger.services import account_freeze, customer_get_or_create, hold_authorize
from tests.conftest import run_in_threads
from tests.helpers import assert_problem, balance, customer, new_key

pytestmark = pytest.mark.django_db

PATH = "/api/v1/transfers"


def send(client, body, key: str | None = None):
    return client.post(
        PATH, body, format="json", headers={"Idempotency-Key": key or new_key()}
    )


def client_of(username: str) -> APIClient:
    _, token, _ = customer_get_or_create(username=username, currency="CNY")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


@pytest.fixture
def alice():
    return customer("alice", balance=10_000)


@pytest.fixture
def bob():
    return customer("bob")


def test_a_transfer_debits_the_sender_and_credits_the_recipient_once(alice, bob):
    _, client, wallet = alice
    _, bob_client, bob_wallet = bob
    response = send(
        client, {"to": "bob", "amount": 2500, "currency": "CNY", "description": "Tea"}
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == {
        "id", "from", "to", "amount", "currency", "status", "created_at"
    }  # fmt: skip
    assert (body["from"], body["to"], body["amount"], body["status"]) == (
        "alice",
        "bob",
        2500,
        "succeeded",
    )
    assert (balance(wallet), balance(bob_wallet)) == (7500, 2500)
    entry = Transfer.objects.get(pk=body["id"]).entry
    assert entry.kind == "transfer"
    assert sorted(entry.postings.values_list("account_id", "amount")) == sorted(
        [(wallet.pk, -2500), (bob_wallet.pk, 2500)]
    )
    # Both see it among their entries, with the balance it left them.
    mine = client.get("/api/v1/accounts/me/entries").json()["results"][0]
    theirs = bob_client.get("/api/v1/accounts/me/entries").json()["results"][0]
    assert (mine["kind"], mine["amount"], mine["balance_after"]) == (
        "transfer",
        -2500,
        7500,
    )
    assert (theirs["amount"], theirs["balance_after"], theirs["description"]) == (
        2500,
        2500,
        "Tea",
    )
    assert ledger_report()["ok"]


def test_a_transfer_without_a_currency_is_in_the_default_one(alice, bob):
    """Money is minor units plus a currency, CNY (the setting) when left out: in
    a transfer as in an order; in a batch, item by item."""
    _, client, wallet = alice
    _, _, bob_wallet = bob
    single = send(client, {"to": "bob", "amount": 100})
    assert single.status_code == 201, single.content
    assert single.json()["currency"] == "CNY"
    batch = send(
        client,
        {"transfers": [{"to": "bob", "amount": 10}, {**ITEM, "amount": 20}]},
    )
    assert batch.status_code == 201, batch.content
    assert [t["currency"] for t in batch.json()["transfers"]] == ["CNY", "CNY"]
    assert (balance(wallet), balance(bob_wallet)) == (9870, 130)
    assert ledger_report()["ok"]


def test_customers_with_the_longest_usernames_transfer_without_a_description():
    """The entry's own description names both customers; two usernames of 150
    characters (the longest there are) once made it too long for the column: a
    500 instead of the transfer."""
    sender, recipient = "s" * 150, "r" * 150
    _, client, wallet = customer(sender, balance=1000)
    _, _, recipient_wallet = customer(recipient)
    single = send(client, {"to": recipient, "amount": 100})
    assert single.status_code == 201, single.content
    batch = send(client, {"transfers": [{"to": recipient, "amount": 10}] * 2})
    assert batch.status_code == 201, batch.content
    assert (balance(wallet), balance(recipient_wallet)) == (880, 120)
    entry = Transfer.objects.get(pk=single.json()["id"]).entry
    assert entry.description.startswith(f"Transfer from {sender} to r")
    assert len(entry.description) <= 255
    assert ledger_report()["ok"]


def test_a_retry_with_the_same_key_replays(alice, bob):
    _, client, wallet = alice
    key = new_key()
    first = send(client, {"to": "bob", "amount": 100, "currency": "CNY"}, key)
    again = send(client, {"to": "bob", "amount": 100, "currency": "CNY"}, key)
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert Transfer.objects.count() == 1
    assert balance(wallet) == 9900
    refused = send(client, {"to": "bob", "amount": 101, "currency": "CNY"}, key)
    assert_problem(refused, 422, "idempotency_key_reused")


def test_a_batch_moves_everything_in_order(alice, bob):
    _, client, wallet = alice
    _, _, carol_wallet = customer("carol")
    items = [
        {"to": "bob", "amount": 100, "currency": "CNY"},
        {"to": "carol", "amount": 200, "currency": "CNY", "description": "Rent"},
        {"to": "bob", "amount": 300, "currency": "CNY"},
    ]
    response = send(client, {"transfers": items})
    assert response.status_code == 201, response.content
    body = response.json()
    assert [(t["to"], t["amount"]) for t in body["transfers"]] == [
        ("bob", 100),
        ("carol", 200),
        ("bob", 300),
    ]
    assert len({t["id"] for t in body["transfers"]}) == 3
    assert Transfer.objects.filter(batch_id=body["id"]).count() == 3
    # The batch's own URL (its id numbers batches, not transfers): its sender reads
    # it as it was answered; a recipient, who sees its own transfers, does not.
    url = f"{PATH}/batches/{body['id']}"
    assert response["Location"] == f"http://testserver{url}"
    assert client.get(url).json() == body
    assert_problem(bob[1].get(url), 404, "not_found")
    assert_problem(client.get(f"{PATH}/batches/{2**70}"), 404, "not_found")
    assert (balance(wallet), balance(bob[2]), balance(carol_wallet)) == (
        9400,
        400,
        200,
    )
    # Each posting explains itself: the sender's balance step by step, and the
    # version counting every posting.
    steps = list(
        Posting.objects.filter(account=wallet)
        .order_by("id")
        .values_list("amount", "balance_after", "version")
    )
    assert steps == [(10_000, 10_000, 1), (-100, 9900, 2), (-200, 9700, 3),
                     (-300, 9400, 4)]  # fmt: skip
    wallet.refresh_from_db()
    assert wallet.version == 4
    assert ledger_report()["ok"]


def test_a_batch_with_refused_items_moves_nothing_and_names_each(alice, bob):
    _, client, wallet = alice
    customer("frozen")
    account_freeze(account_id=Account.objects.get(owner__username="frozen").pk)
    entries = JournalEntry.objects.count()
    items = [
        {"to": "bob", "amount": 100, "currency": "CNY"},
        {"to": "nobody", "amount": 100, "currency": "CNY"},  # 1 recipient_unknown
        {"to": "alice", "amount": 100, "currency": "CNY"},  # 2 invalid_transfer
        {"to": "bob", "amount": 0, "currency": "CNY"},  # 3 invalid_transfer
        {"to": "bob", "amount": -5, "currency": "CNY"},  # 4 invalid_transfer
        {"to": "bob", "amount": 9900, "currency": "CNY"},  # the rest of the money
        {"to": "bob", "amount": 1, "currency": "CNY"},  # 6 insufficient_funds
        {"to": "bob", "amount": 1, "currency": "USD"},  # 7 currency_mismatch
        {"to": "frozen", "amount": 1, "currency": "CNY"},  # 8 account_not_active
    ]
    body = assert_problem(send(client, {"transfers": items}), 422, "recipient_unknown")
    assert body["errors"] == [
        {"index": 1, "code": "recipient_unknown"},
        {"index": 2, "code": "invalid_transfer"},
        {"index": 3, "code": "invalid_transfer"},
        {"index": 4, "code": "invalid_transfer"},
        {"index": 6, "code": "insufficient_funds"},
        {"index": 7, "code": "currency_mismatch"},
        {"index": 8, "code": "account_not_active"},
    ]
    assert JournalEntry.objects.count() == entries
    assert not Transfer.objects.exists()
    assert (balance(wallet), balance(bob[2])) == (10_000, 0)


def test_insufficient_funds_names_balance_held_and_available(alice, bob):
    """As a payment's refusal does: what holds reserve is not available."""
    _, client, wallet = alice
    hold_authorize(
        account_id=wallet.pk,
        amount=8_000,
        reference="reserved",
        expires_in=timedelta(hours=1),
    )
    body = {"to": "bob", "amount": 3_000, "currency": "CNY"}
    answer = send(client, body, new_key())
    assert_problem(answer, 422, "insufficient_funds")
    problem = answer.json()
    assert (problem["balance"], problem["held"], problem["available"]) == (
        10_000,
        8_000,
        2_000,
    )
    assert problem["amount"] == 3_000


@pytest.mark.parametrize("who", ["staff", "gone"])
def test_staff_and_deactivated_users_are_no_recipients(alice, who):
    """Unknown, as a name nobody has: the refusal tells nothing of who exists."""
    from django.contrib.auth import get_user_model

    User = get_user_model()
    if who == "staff":
        User.objects.create_superuser(who, password="x")
    else:
        customer(who)
        User.objects.filter(username=who).update(is_active=False)
    _, client, wallet = alice
    body = {"to": who, "amount": 1, "currency": "CNY"}
    assert_problem(send(client, body, new_key()), 422, "recipient_unknown")
    assert balance(wallet) == 10_000


def test_a_customer_with_no_wallet_yet_receives_in_the_default_currency(alice):
    """A customer made in the admin has no wallet row until the API first shows it
    (`accounts/me` makes it): the transfer makes it too, rather than refusing with
    a `currency_mismatch` that a mere read by the recipient would have avoided."""
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_user("dave")
    _, client, wallet = alice
    wallets = Account.objects.filter(owner__username="dave", kind="wallet")
    # Refused, it makes nothing: the wallet comes with the money or not at all.
    refused = {"to": "dave", "amount": 10_001, "currency": "CNY"}
    assert_problem(send(client, refused), 422, "insufficient_funds")
    assert not wallets.exists()

    response = send(client, {"to": "dave", "amount": 300, "currency": "CNY"})

    assert response.status_code == 201, response.content
    assert (balance(wallet), balance(wallets.get(currency="CNY"))) == (9_700, 300)
    # Another currency is one the recipient must hold a wallet in.
    other = {"to": "dave", "amount": 1, "currency": "USD"}
    assert_problem(send(client, other), 422, "currency_mismatch")
    assert list(wallets.values_list("currency", flat=True)) == ["CNY"]
    assert ledger_report()["ok"]


def test_a_sender_with_no_wallet_yet_has_nothing_to_send(bob):
    """Its wallet in the default currency is the empty one `accounts/me` would
    show it: not enough money, not a currency it lacks."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    dave = get_user_model().objects.create_user("dave")
    token = Token.objects.create(user=dave)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")

    answer = send(client, {"to": "bob", "amount": 1, "currency": "CNY"})

    assert_problem(answer, 422, "insufficient_funds")
    problem = answer.json()
    assert (problem["balance"], problem["held"], problem["available"]) == (0, 0, 0)
    assert not Account.objects.filter(owner=dave).exists()
    batch = {"transfers": [{"to": "bob", "amount": 1, "currency": "CNY"}]}
    assert_problem(send(client, batch), 422, "insufficient_funds")


ITEM: dict = {"to": "bob", "amount": 1, "currency": "CNY"}


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"to": "bob", "amount": 10_001, "currency": "CNY"}, 422, "insufficient_funds"),
        ({"to": "nobody", "amount": 1, "currency": "CNY"}, 422, "recipient_unknown"),
        ({"to": "alice", "amount": 1, "currency": "CNY"}, 422, "invalid_transfer"),
        ({"to": "bob", "amount": 0, "currency": "CNY"}, 422, "invalid_transfer"),
        ({"to": "bob", "amount": -1, "currency": "CNY"}, 422, "invalid_transfer"),
        ({"to": "bob", "amount": 1, "currency": "USD"}, 422, "currency_mismatch"),
        # Past the largest amount an order may have, within 64 bits: still "amount
        # not positive" or more than the wallet holds, as the contract names them
        # (they were 400s for their form); past 64 bits, a 400 (below).
        (
            {"to": "bob", "amount": -(10**15) - 1, "currency": "CNY"},
            422,
            "invalid_transfer",
        ),
        ({"to": "bob", "amount": -(2**63), "currency": "CNY"}, 422, "invalid_transfer"),
        (
            {"to": "bob", "amount": 10**15 + 1, "currency": "CNY"},
            422,
            "insufficient_funds",
        ),
        (
            {"to": "bob", "amount": 2**63 - 1, "currency": "CNY"},
            422,
            "insufficient_funds",
        ),
        (
            {"transfers": [ITEM, {**ITEM, "amount": 2**63 - 1}] * 50},
            422,
            "insufficient_funds",
        ),
    ],
)
def test_a_refused_transfer_moves_nothing(alice, bob, body, status, code):
    _, client, wallet = alice
    key = new_key()
    assert_problem(send(client, body, key), status, code)
    assert not Transfer.objects.exists()
    assert balance(wallet) == 10_000
    # A business refusal is stored: the same request again is its replay.
    again = send(client, body, key)
    assert again.status_code == status
    assert again["Idempotent-Replayed"] == "true"


@pytest.mark.parametrize(
    ("field", "spaced"), [("to", " bob"), ("to", "bob "), ("currency", "CNY\t")]
)
def test_a_recipient_or_currency_with_whitespace_around_it_is_refused(
    alice, bob, field, spaced
):
    """`" bob"` was trimmed and sent to bob: another request than the one sent."""
    _, client, wallet = alice
    body = {"to": "bob", "amount": 1, "currency": "CNY", field: spaced}
    problem = assert_problem(send(client, body), 400, "validation_error")
    assert problem["errors"] == {
        field: ["Remove the whitespace around the value: it is taken as sent."]
    }
    assert not Transfer.objects.exists()
    assert balance(wallet) == 10_000


@pytest.mark.parametrize("who", ["alice", "bob"])
def test_a_frozen_wallet_on_either_side_refuses(alice, bob, who):
    _, client, _ = alice
    account_freeze(account_id=Account.objects.get(owner__username=who).pk)
    body = {"to": "bob", "amount": 1, "currency": "CNY"}
    assert_problem(send(client, body), 409, "account_not_active")
    assert not Transfer.objects.exists()


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"amount": 1, "currency": "CNY"},
        {"to": "bob", "currency": "CNY"},
        {"to": "bob", "amount": 1, "currency": None},
        {"to": "bob", "amount": 10**30, "currency": "CNY"},
        {"to": "bob", "amount": -(10**30), "currency": "CNY"},
        {"to": "bob", "amount": 2**63, "currency": "CNY"},
        {"to": "bob", "amount": -(2**63) - 1, "currency": "CNY"},
        {"to": "bob", "amount": "1", "currency": "CNY"},
        {"to": "bob", "amount": 1.5, "currency": "CNY"},
        {"to": "bob", "amount": True, "currency": "CNY"},
        {"to": "bob", "amount": 1, "currency": "ZZZ"},
        {"to": 7, "amount": 1, "currency": "CNY"},
        {"to": "bob", "amount": 1, "currency": "CNY", "extra": 1},
        {"to": "b" * 151, "amount": 1, "currency": "CNY"},
        {"transfers": []},
        {"transfers": [ITEM] * 101},
        {"transfers": ITEM},
        {"transfers": [ITEM, {**ITEM, "amount": 10**30}]},
        {"transfers": [ITEM, {**ITEM, "sneaky": True}]},
        {"transfers": [ITEM], "to": "bob"},
        [ITEM],
    ],
)
def test_bad_input_is_a_400_problem_and_writes_nothing(alice, bob, body):
    _, client, wallet = alice
    key = new_key()
    body = assert_problem(send(client, body, key), 400, "validation_error")
    assert body["errors"]
    assert not Transfer.objects.exists()
    assert balance(wallet) == 10_000
    # Refused for its form: the key stays free for the corrected request.
    assert send(client, ITEM, key).status_code == 201


def test_malformed_json_is_a_400_problem(alice, bob):
    _, client, _ = alice
    response = client.post(
        PATH, b'{"to": ', content_type="application/json",
        headers={"Idempotency-Key": new_key()},
    )  # fmt: skip
    assert_problem(response, 400, "malformed_json")
    assert_problem(client.post(PATH, ITEM, format="json"), 400,
                   "idempotency_key_missing")  # fmt: skip


def test_sender_and_recipient_see_a_transfer_nobody_else(alice, bob):
    _, client, _ = alice
    _, bob_client, _ = bob
    _, carol_client, _ = customer("carol")
    answer = send(client, ITEM)
    made = answer.json()
    url = f"{PATH}/{made['id']}"
    assert answer["Location"] == f"http://testserver{url}"
    assert client.get(url).json() == made
    assert bob_client.get(url).json() == made
    assert_problem(carol_client.get(url), 404, "not_found")
    assert_problem(client.get(f"{PATH}/{made['id'] + 1000}"), 404, "not_found")
    assert_problem(client.get(f"{PATH}/{2**70}"), 404, "not_found")
    assert APIClient().get(url).status_code == 401


def test_a_batch_of_100_to_100_recipients(alice):
    _, client, wallet = alice
    names = [f"r{n}" for n in range(100)]
    for name in names:
        customer_get_or_create(username=name, currency="CNY")
    items = [{"to": name, "amount": n + 1, "currency": "CNY"} for n, name in
             enumerate(names)]  # fmt: skip
    response = send(client, {"transfers": items})
    assert response.status_code == 201, response.content
    assert balance(wallet) == 10_000 - sum(range(1, 101))
    assert Posting.objects.filter(entry__kind="transfer").count() == 200
    assert ledger_report()["ok"]
    # Every row the batch wrote in one INSERT of arrays is the one the answer names,
    # linked to its own entry and postings, in the items' order.
    made = response.json()["transfers"]
    stored = Transfer.objects.select_related("entry", "recipient").in_bulk(
        [transfer["id"] for transfer in made]
    )
    for index, answer in enumerate(made):
        transfer = stored[answer["id"]]
        assert (transfer.index, transfer.recipient.username, transfer.amount) == (
            index,
            names[index],
            index + 1,
        )
        assert answer["created_at"] == transfer.created_at.isoformat().replace(
            "+00:00", "Z"
        )
        entry = transfer.entry
        assert entry.reference == f"transfer:{transfer.batch_id}:{index}"
        assert (entry.kind, entry.params) == ("transfer", {})
        assert entry.description == f"Transfer from alice to {names[index]}"
        amounts = sorted(entry.postings.values_list("amount", flat=True))
        assert amounts == [-(index + 1), index + 1]


@pytest.mark.django_db(transaction=True)
def test_opposite_transfers_from_20_threads_never_deadlock():
    users = ["alice", "bob", "carol"]
    for name in users:
        customer(name, balance=100_000)
    clients = {name: client_of(name) for name in users}

    def work(i: int) -> int:
        sender, to = users[i % 3], users[(i + 1 + i // 3 % 2) % 3]
        if i % 4 == 0:  # some batches, crossing the others' directions
            others = [u for u in users if u != sender]
            body: dict = {
                "transfers": [
                    {"to": name, "amount": 10 + i, "currency": "CNY"}
                    for name in (others + others[::-1])
                ]
            }
        else:
            body = {"to": to, "amount": 100 + i, "currency": "CNY"}
        return send(clients[sender], body).status_code

    statuses = run_in_threads(20, work)
    assert statuses == [201] * 20, statuses
    wallets = Account.objects.filter(owner__username__in=users)
    assert wallets.aggregate(total=Sum("balance"))["total"] == 300_000
    report = ledger_report()
    assert report["ok"], report["violations"]


@pytest.mark.django_db(transaction=True)
def test_30_keys_sending_the_last_money_succeed_as_often_as_affordable():
    _, _, wallet = customer("alice", balance=500)
    _, _, bob_wallet = customer("bob")
    clients = [client_of("alice") for _ in range(30)]

    def work(i: int):
        return send(clients[i], {"to": "bob", "amount": 100, "currency": "CNY"})

    responses = run_in_threads(30, work)
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [201] * 5 + [422] * 25, statuses
    for response in responses:
        if response.status_code == 422:
            assert_problem(response, 422, "insufficient_funds")
    assert (balance(wallet), balance(bob_wallet)) == (0, 500)
    assert Transfer.objects.count() == 5
    assert ledger_report()["ok"]


@pytest.mark.django_db(transaction=True)
def test_one_key_from_10_threads_transfers_once():
    _, _, wallet = customer("alice", balance=1000)
    customer("bob")
    clients = [client_of("alice") for _ in range(10)]
    key = new_key()

    def work(i: int):
        return send(clients[i], {"to": "bob", "amount": 100, "currency": "CNY"}, key)

    responses = run_in_threads(10, work)
    assert {r.status_code for r in responses} <= {201, 409}, responses
    assert any(r.status_code == 201 for r in responses)
    assert Transfer.objects.count() == 1
    assert balance(wallet) == 900
    assert IdempotencyRecord.objects.filter(key=key).count() == 1


@pytest.mark.django_db(transaction=True)
def test_batches_racing_to_recipients_with_no_wallet_yet_make_each_once():
    """Two customers nobody has paid yet, sent to from 10 threads, the two named in
    either order: each gets one wallet and every transfer, and nobody deadlocks."""
    from django.contrib.auth import get_user_model

    for name in ("dave", "erin"):
        get_user_model().objects.create_user(name)
    clients = []
    for i in range(10):
        customer(f"sender{i}", balance=1000)
        clients.append(client_of(f"sender{i}"))

    def work(i: int):
        pair = ["dave", "erin"] if i % 2 else ["erin", "dave"]
        items = [{"to": to, "amount": 10, "currency": "CNY"} for to in pair]
        return send(clients[i], {"transfers": items}).status_code

    assert run_in_threads(10, work) == [201] * 10
    wallets = Account.objects.filter(owner__username__in=["dave", "erin"])
    assert sorted(wallets.values_list("owner__username", "currency", "balance")) == [
        ("dave", "CNY", 100),
        ("erin", "CNY", 100),
    ]
    report = ledger_report()
    assert report["ok"], report["violations"]


def test_a_wait_preference_of_a_non_ascii_digit_is_no_preference(alice, bob):
    # `Prefer: wait=\u00b2` (a latin-1 header may carry it): once a 500.
    _, client, _ = alice
    response = client.post(
        PATH,
        {"to": "bob", "amount": 100, "currency": "CNY"},
        format="json",
        headers={"Idempotency-Key": new_key(), "Prefer": "wait=\u00b2"},
    )
    assert response.status_code == 201, response.content
    assert balance(bob[2]) == 100
