"""Domain errors: the one base class every app's errors derive from.

`DomainError` builds on the idempotency library's `ProblemError`: each error carries an
HTTP status and a stable machine-readable `code`; the single DRF exception handler in
`ledger.problems` renders them all as RFC 9457 problem details. Views never build
error bodies by hand.
"""

from idempotency.exceptions import ProblemError


class DomainError(ProblemError):
    """A business rule refused the request (the idempotency layer's errors are
    ProblemErrors too, so one handler renders both)."""


class InsufficientFunds(DomainError):
    status = 422
    code = "insufficient_funds"
    title = "Insufficient funds"
    default_detail = (
        "The account's available money (its balance less what holds reserve) is "
        "lower than the amount."
    )


class AccountNotActive(DomainError):
    status = 409
    code = "account_not_active"
    title = "Account not active"
    default_detail = "Money can only leave an active account."


class AccountNotFound(DomainError):
    status = 404
    code = "account_not_found"
    title = "Account not found"


class CurrencyMismatch(DomainError):
    status = 422
    code = "currency_mismatch"
    title = "Currency mismatch"
    default_detail = "All accounts of a journal entry must share its currency."


class ReferenceConflict(DomainError):
    status = 409
    code = "reference_conflict"
    title = "Reference already used"
    default_detail = "A different journal entry already carries this reference."


class StaleVersion(DomainError):
    status = 409
    code = "stale_version"
    title = "Changed under you"
    default_detail = "The account changed since you read it; read it again and retry."


class HoldNotActive(DomainError):
    status = 409
    code = "hold_not_active"
    title = "Hold not active"
    default_detail = "The hold was already captured, voided or expired."
