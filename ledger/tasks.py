import logging

from celery import shared_task
from django.db import transaction

from .exceptions import AccountNotActive
from .invariants import ledger_report
from .selectors import merchant_sub_accounts_to_sweep
from .services import journal_seal, merchant_sweep

logger = logging.getLogger(__name__)


@shared_task
def check_invariants() -> bool:
    """Prove the ledger's invariants; log every violation loudly, every warning."""
    report = ledger_report()
    for violation in report["violations"]:
        logger.error("ledger invariant violated: %s", violation)
    for warning in report["warnings"]:
        logger.warning("ledger warning: %s", warning)
    return report["ok"]


@shared_task
def seal_journal() -> int:
    """Seal the journal entries committed since the last run into the hash chain."""
    with transaction.atomic(durable=True):
        return journal_seal()


@shared_task
def sweep_merchant_sub_accounts() -> int:
    """Sweep every sub-account holding money (a merchant's, or the outside
    world's) into its parent, each in its own transaction; return how many were
    swept."""
    swept = 0
    for account_id in merchant_sub_accounts_to_sweep().values_list("pk", flat=True):
        try:
            with transaction.atomic(durable=True):  # the task is the entry point
                swept += merchant_sweep(account_id=account_id) is not None
        except AccountNotActive:  # frozen by staff: its money stays until unfrozen
            logger.warning("sub-account %s is not active", account_id)
    return swept
