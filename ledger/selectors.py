from django.db.models import QuerySet

from .models import Account, Posting


def account_postings(*, account: Account) -> QuerySet[Posting]:
    """The account's postings with their entries, newest first."""
    return (
        Posting.objects.filter(account=account).select_related("entry").order_by("-id")
    )
