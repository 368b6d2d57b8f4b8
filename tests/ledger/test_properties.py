"""Any sequence of ledger operations keeps every invariant."""

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.exceptions import DomainError
from ledger.invariants import ledger_report
from ledger.models import Account
from ledger.services import (
    TransferItem,
    account_freeze,
    account_unfreeze,
    journal_seal,
    ledger_deposit,
    ledger_transfer,
    transfer_batch_create,
)
from tests.factories import WalletFactory

ACCOUNTS = 4
amounts = st.integers(min_value=1, max_value=5_000)
accounts = st.integers(min_value=0, max_value=ACCOUNTS - 1)
references = st.sampled_from([f"ref-{n}" for n in range(12)])  # collisions on purpose
operations = st.lists(
    st.one_of(
        st.tuples(st.just("deposit"), accounts, amounts, references),
        st.tuples(
            st.just("transfer"), st.tuples(accounts, accounts), amounts, references
        ),
        # A customers' batch: all or nothing (one to oneself refuses it all).
        st.tuples(
            st.just("batch"),
            accounts,
            st.lists(st.tuples(accounts, amounts), min_size=1, max_size=4),
        ),
        st.just(("seal",)),
        st.tuples(st.just("freeze"), accounts),
        st.tuples(st.just("unfreeze"), accounts),
    ),
    max_size=25,
)


@pytest.mark.django_db
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=operations)
def test_any_sequence_keeps_the_ledger_sound(ops):
    with transaction.atomic():
        wallets = [WalletFactory().pk for _ in range(ACCOUNTS)]
        for op in ops:
            try:
                with transaction.atomic():
                    apply(op, wallets)
            except (DomainError, ValueError):
                pass  # refused operations must leave no trace; the report checks that
            except Exception as exc:  # a transition refused by the state machine
                assert type(exc).__name__ == "TransitionNotAllowed", exc
        report = ledger_report()
        assert report["ok"], report["violations"]
        assert (
            min(
                Account.objects.values_list("balance", flat=True).filter(pk__in=wallets)
            )
            >= 0
        )
        transaction.set_rollback(True)


def apply(op, wallets):
    match op:
        case ("deposit", who, amount, ref):
            ledger_deposit(account_id=wallets[who], amount=amount, reference=ref)
        case ("transfer", (source, destination), amount, ref):
            ledger_transfer(
                source_id=wallets[source],
                destination_id=wallets[destination],
                amount=amount,
                currency="CNY",
                reference=ref,
            )
        case ("batch", source, items):
            owners = dict(
                Account.objects.filter(pk__in=wallets).values_list("pk", "owner")
            )
            sender = User.objects.get(pk=owners[wallets[source]])
            names = dict(User.objects.values_list("pk", "username"))
            transfer_batch_create(
                sender=sender,
                items=[
                    TransferItem(
                        to=names[owners[wallets[to]]], amount=amount, currency="CNY"
                    )
                    for to, amount in items
                ],
            )
        case ("seal",):
            journal_seal()
        case ("freeze", who):
            account_freeze(account_id=wallets[who])
        case ("unfreeze", who):
            account_unfreeze(account_id=wallets[who])
