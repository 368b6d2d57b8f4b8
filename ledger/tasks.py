import logging

from celery import shared_task

from .invariants import ledger_report

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
