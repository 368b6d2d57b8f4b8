from django.contrib.auth.models import User
from django.db.models import Q, QuerySet
from django.http import Http404
from django.shortcuts import get_object_or_404

from .models import Account, Posting, Transfer, TransferBatch


def account_postings(*, account: Account) -> QuerySet[Posting]:
    """The account's postings with their entries, newest first."""
    return (
        Posting.objects.filter(account=account).select_related("entry").order_by("-id")
    )


def transfer_get(*, user: User, transfer_id: int) -> Transfer:
    """A transfer its sender or its recipient may see; 404 for anyone else."""
    if not 0 < transfer_id < 2**63:
        raise Http404("no such transfer")
    return get_object_or_404(
        Transfer.objects.select_related("sender", "recipient"),
        Q(sender=user) | Q(recipient=user),
        pk=transfer_id,
    )


def transfer_batch_get(*, user: User, batch_id: int) -> list[Transfer]:
    """A batch's transfers in the order they were asked for, for its sender; 404
    for anyone else (a recipient sees its own transfers one by one)."""
    if not 0 < batch_id < 2**63:
        raise Http404("no such transfer batch")
    batch = get_object_or_404(TransferBatch, sender=user, pk=batch_id)
    return list(batch.transfers.select_related("sender", "recipient").order_by("index"))


def merchant_sub_accounts_to_sweep() -> QuerySet[Account]:
    """The sub-accounts (a merchant's, the outside world's) holding money a sweep
    would move up: active ones (money leaves only an active account) under a parent
    that is not closed (a closed account takes no money). An outside sub-account's
    balance is below zero as a rule: swept, it is what leaves the parent."""
    return (
        Account.objects.filter(parent__isnull=False, status=Account.Status.ACTIVE)
        .exclude(balance=0)
        .exclude(parent__status=Account.Status.CLOSED)
        .order_by("pk")
    )
