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


class RecipientUnknown(DomainError):
    status = 422
    code = "recipient_unknown"
    title = "Recipient unknown"
    default_detail = "No customer has this username."


class InvalidTransfer(DomainError):
    status = 422
    code = "invalid_transfer"
    title = "Invalid transfer"
    default_detail = "A transfer moves a positive amount to someone else."


class TransferBatchRefused(DomainError):
    """Some items of a batch were refused: nothing moved. The code is the first
    refusal's; `errors` names every refused item by its index."""

    status = 422
    code = ""  # per instance: the first refusal's (a code listed by its own class)
    title = "Transfer batch refused"

    def __init__(self, refusals: list[tuple[int, DomainError]]) -> None:
        self.refusals = refusals
        self.code = refusals[0][1].code
        super().__init__(
            f"{len(refusals)} transfer(s) of the batch were refused, so none was "
            "made; see `errors`.",
            errors=[{"index": index, "code": error.code} for index, error in refusals],
        )


class AccountTransitionRefused(DomainError):
    status = 409
    code = "account_transition_refused"
    title = "Not possible in this state"
    default_detail = "The account's state has no such transition."


class AccountBusy(DomainError):
    """A close could not lock the account in time: money kept moving through it."""

    status = 409
    code = "account_busy"
    title = "Account busy"
    default_detail = "Money is moving through the account; try again in a moment."


class AccountNotEmpty(DomainError):
    """Closing an account that still holds money (or reserves it for a hold): once
    closed, nothing could move it out again."""

    status = 409
    code = "account_not_empty"
    title = "Account not empty"
    default_detail = "Only an account that holds no money can be closed."

    def __init__(
        self, *, account_id: int, balance: int, held: int, currency: str
    ) -> None:
        # (Kept apart for a message in the reader's language: the back office's.)
        self.account_id, self.balance, self.held = account_id, balance, held
        self.currency = currency
        money = f"{balance} {currency}" + (f" ({held} on hold)" if held else "")
        super().__init__(
            f"Account {account_id} holds {money}; only an account that holds "
            "nothing can be closed.",
            account_id=account_id,
            balance=balance,
            held=held,
        )


class SubAccountClosesWithMerchant(AccountTransitionRefused):
    """A merchant sub-account closed alone: a payment may have chosen it a moment
    before, its merchant active, and would be refused though the merchant takes
    money. It closes with its merchant."""


class NotAWallet(DomainError):
    status = 422
    code = "not_a_wallet"
    title = "Not a customer wallet"
    default_detail = "Only a customer's wallet can be credited."


class HoldNotActive(DomainError):
    status = 409
    code = "hold_not_active"
    title = "Hold not active"
    default_detail = "The hold was already captured, voided or expired."
