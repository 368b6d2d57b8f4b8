"""`idempotent_call` and `@idempotent_task`: the engine's key store for plain calls
and Celery tasks. Real threads on the real database, as for HTTP requests."""

import uuid

import pytest

from idempotency.calls import idempotent_call, idempotent_task
from idempotency.exceptions import IdempotencyKeyReused
from ledger.models import JournalEntry
from ledger.services import ledger_deposit
from tests.conftest import run_in_threads

pytestmark = pytest.mark.django_db(transaction=True)


def deposit(wallet_id: int, amount: int) -> dict:
    """The effect under test: a real deposit, counted in the database."""
    entry = ledger_deposit(
        account_id=wallet_id, amount=amount, reference=f"call:{uuid.uuid4()}"
    )
    return {"entry": entry.pk, "amount": amount}


@idempotent_task(key=lambda wallet_id, amount: f"deposit:{wallet_id}:{amount}")
def deposit_task(wallet_id: int, amount: int) -> dict:
    return deposit(wallet_id, amount)


def deposits(customer) -> int:
    return JournalEntry.objects.filter(postings__account=customer.wallet).count()


def test_a_call_runs_once_and_returns_the_stored_result(alice):
    first = idempotent_call(
        "tests", "once", lambda: deposit(alice.wallet.pk, 5), request=[5]
    )
    again = idempotent_call(
        "tests", "once", lambda: deposit(alice.wallet.pk, 5), request=[5]
    )
    assert again == first
    assert deposits(alice) == 1


def test_concurrent_calls_run_once(alice, on_postgres):
    results = run_in_threads(
        8,
        lambda _: idempotent_call(
            "tests", "burst", lambda: deposit(alice.wallet.pk, 7), request=[7]
        ),
    )
    assert all(result == results[0] for result in results), results
    assert deposits(alice) == 1


def test_another_request_under_the_key_is_refused(alice):
    idempotent_call("tests", "k", lambda: deposit(alice.wallet.pk, 5), request=[5])
    with pytest.raises(IdempotencyKeyReused):
        idempotent_call("tests", "k", lambda: deposit(alice.wallet.pk, 6), request=[6])
    assert deposits(alice) == 1


def test_a_failed_call_stores_nothing_and_runs_again(alice):
    def crash() -> dict:
        deposit(alice.wallet.pk, 5)
        raise RuntimeError("crashed after the deposit")

    with pytest.raises(RuntimeError):
        idempotent_call("tests", "retry", crash, request=[5])
    assert deposits(alice) == 0  # rolled back with the key
    idempotent_call("tests", "retry", lambda: deposit(alice.wallet.pk, 5), request=[5])
    assert deposits(alice) == 1


def test_bad_keys_are_refused(alice):
    for bad in ("", "x" * 256, "caf\u00e9", "tab\there"):
        with pytest.raises(ValueError):
            idempotent_call("tests", bad, lambda: 1)


def test_a_task_delivered_twice_runs_its_body_once(alice, on_postgres):
    """Each `apply` is a delivery, as a redelivering broker makes them; some at once."""
    results = run_in_threads(
        6, lambda _: deposit_task.apply(args=[alice.wallet.pk, 9]).get()
    )
    assert all(result == results[0] for result in results), results
    assert deposit_task.apply(args=[alice.wallet.pk, 9]).get() == results[0]
    assert deposits(alice) == 1
    # Another key is another operation; so is an explicit one.
    deposit_task.apply(args=[alice.wallet.pk, 10]).get()
    deposit_task.apply(
        args=[alice.wallet.pk, 10], kwargs={"idempotency_key": "explicit"}
    ).get()
    assert deposits(alice) == 3
