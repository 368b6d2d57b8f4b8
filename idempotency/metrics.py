"""Counters for every idempotency outcome and the time spent waiting for key locks.

Read them at `/metrics` (Prometheus text format).
"""

from contextvars import ContextVar

from prometheus_client import Counter, Histogram

OUTCOMES = (
    "executed",  # the view ran and its response was stored
    "replayed",  # a stored response was returned (from Redis or the database)
    "in_flight",  # 409: the first request with this key has not finished
    "reused",  # 422: the key came back with a different request
    "missing",  # 400: no key on an endpoint that requires one
    "invalid",  # 400: a malformed key
    "fallback",  # Redis failed; the database path was used
    "refused",  # Redis failed and the setting says refuse: 503
    "released",  # 5xx/429: nothing stored, the key is free for a retry
    "taken_over",  # a retry took over a key whose lease had expired
)

requests = Counter(
    "idempotency_requests",
    "Idempotent requests by outcome.",
    ["outcome"],
)
lock_wait = Histogram(
    "idempotency_lock_wait_seconds",
    "Time spent acquiring the per-key lock (Redis or database).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)

# Every series exported from the start, at zero; each bound once, as `labels()`
# validates and looks its label up again on every call.
_by_outcome = {outcome: requests.labels(outcome) for outcome in OUTCOMES}


# The outcomes of the current request, for its log line (ledger.middleware sets it).
current_outcomes: ContextVar[list[str] | None] = ContextVar(
    "idempotency_outcomes", default=None
)


def count(outcome: str) -> None:
    _by_outcome[outcome].inc()
    outcomes = current_outcomes.get()
    if outcomes is not None:
        outcomes.append(outcome)
