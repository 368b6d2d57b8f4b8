import logging

from celery import shared_task
from django.db import transaction

from .invariants import ledger_report
from .services import journal_seal

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
