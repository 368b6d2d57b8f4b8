from ledger.exceptions import DomainError


class IdempotencyKeyMissing(DomainError):
    status = 400
    code = "idempotency_key_missing"
    title = "Idempotency-Key header missing"
    default_detail = (
        "This endpoint changes state: send an Idempotency-Key header (1 to 255 "
        "printable ASCII characters), one new key per intended operation."
    )


class IdempotencyKeyInvalid(DomainError):
    status = 400
    code = "idempotency_key_invalid"
    title = "Idempotency-Key header invalid"
    default_detail = "An Idempotency-Key is 1 to 255 printable ASCII characters."


class IdempotencyKeyReused(DomainError):
    status = 422
    code = "idempotency_key_reused"
    title = "Idempotency-Key reused for another request"


class IdempotencyKeyInFlight(DomainError):
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


class IdempotencyUnavailable(DomainError):
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
