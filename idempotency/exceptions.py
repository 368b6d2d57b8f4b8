"""The errors of the idempotency layer, and the base class they share with the app's.

`ProblemError` is an exception that knows its HTTP answer: a status, a stable
machine-readable `code`, a title and a detail (RFC 9457 problem details). The engine
raises its own refusals as ProblemErrors; a project that installs the library derives
its domain errors from it too (here `ledger.exceptions.DomainError`) and renders them
all in one exception handler.
"""

from typing import Any


class ProblemError(Exception):
    status: int = 400
    code: str = "bad_request"
    title: str = "Bad request"
    default_detail: str = ""
    headers: dict[str, str] = {}
    # A refusal of the request's form (a value no request may carry), decided before
    # anything is read: as a body failing the schema, it is not stored under the
    # idempotency key, so the corrected request may use the key.
    refuses_form: bool = False

    def __init__(self, detail: str | None = None, **extra: Any) -> None:
        self.detail = detail or self.default_detail or self.title
        self.extra = extra
        super().__init__(self.detail)


class IdempotencyKeyMissing(ProblemError):
    status = 400
    code = "idempotency_key_missing"
    title = "Idempotency-Key header missing"
    default_detail = (
        "This endpoint changes state: send an Idempotency-Key header (1 to 255 "
        "printable ASCII characters), one new key per intended operation."
    )


class IdempotencyKeyInvalid(ProblemError):
    status = 400
    code = "idempotency_key_invalid"
    title = "Idempotency-Key header invalid"
    default_detail = "An Idempotency-Key is 1 to 255 printable ASCII characters."


class IdempotencyKeyReused(ProblemError):
    status = 422
    code = "idempotency_key_reused"
    title = "Idempotency-Key reused for another request"


class IdempotencyKeyInFlight(ProblemError):
    status = 409
    code = "idempotency_key_in_flight"
    title = "A request with this Idempotency-Key is in progress"
    default_detail = (
        "The first request with this key has not finished yet. Retry after the "
        "Retry-After delay with the same key to get its result."
    )
    # A live request usually finishes within milliseconds, so we ask for a quick
    # poll; the lease (how long a dead holder blocks the key) is a recovery bound,
    # not a useful hint.
    headers = {"Retry-After": "1"}


class IdempotencyUnavailable(ProblemError):
    status = 503
    code = "idempotency_unavailable"
    title = "Idempotency store unavailable"
    default_detail = "The key store cannot be reached; nothing was done. Retry later."

    def __init__(self) -> None:
        super().__init__()
        self.headers = {"Retry-After": "1"}


class LeaseLost(Exception):
    """This process's lease on a key passed and another request took the key over;
    whatever this process was about to commit must not be committed."""


class IdIssuerUnavailable(ProblemError):
    """No live worker id lease (`idempotency.snowflake`): no number is issued rather
    than one that another process might issue too."""

    status = 503
    code = "id_issuer_unavailable"
    title = "Cannot issue numbers right now"
    default_detail = (
        "This server could not renew its worker id in time, so it issues no number "
        "rather than risk a duplicate. Nothing was done. Retry later."
    )
    headers = {"Retry-After": "1"}
