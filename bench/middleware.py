"""What the benchmark server adds to the project (bench/settings.py), and only there.

* `ReplayMiddlewareOutsideBench`: the project's replay middleware, except on the
  contenders' paths (`/api/v1/bench/...`). There it would make a Redis round trip or two
  (look the caller up, take and release a lock nobody adopts) on every keyed request,
  and charge ours to the contender.
* `BenchMiddleware`, three request headers the benchmark sends:
  - `X-Bench-Merchant: N` credits a balance payment to merchant account N of the
    order's currency instead of the project's one merchant account (the project has
    one merchant per currency, so every payment lands on one hot row; this is how the
    benchmark spreads the same payments over many for comparison). Only which row
    is credited changes: the same service, the same statements.
  - `X-Bench-Sub-Accounts: N` runs the request with `MERCHANT_SUB_ACCOUNTS = N`
    (the benchmark's server has sync workers: one request at a time per process),
    so one server measures the hot merchant with and without its sub-accounts.
  - `X-Bench-Crash: after-commit` SIGKILLs the worker process the moment the request's
    pre-order has committed (inside a transaction: right after its COMMIT; in
    autocommit: right after the INSERT), before anything after the effect runs: the
    crash test of every design (a worker killed after the effect commits).
"""

import os
import signal
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse
from django.test.utils import override_settings

import ledger.services
from idempotency.middleware import ReplayMiddleware
from ledger.models import Account

CONTENDERS = "/api/v1/bench/"
MERCHANT_HEADER = "X-Bench-Merchant"
CRASH_HEADER = "X-Bench-Crash"
SUB_ACCOUNTS_HEADER = "X-Bench-Sub-Accounts"

_merchant: ContextVar[int | None] = ContextVar("bench_merchant", default=None)
_project_merchant_code = ledger.services.merchant_code
BENCH_SUB_ACCOUNTS = 8  # what the hot merchant's payments spread over, when asked


def merchant_code(currency: str) -> str:
    """The project's merchant account's code, or merchant N's when the request
    named one."""
    number = _merchant.get()
    if number is None:
        return _project_merchant_code(currency)
    return f"merchant-{currency.lower()}-{number}"


# The ledger's services look the name up in their module at every call.
ledger.services.merchant_code = merchant_code


def merchants_create(count: int, currency: str = "CNY") -> None:
    """Create merchant accounts 0..count-1 up front, and merchant 0's sub-accounts
    (concurrent first payments would race to create one)."""
    for number in range(count):
        _merchant.set(number)
        main = ledger.services.merchant_account(currency=currency)
        for sub in range(BENCH_SUB_ACCOUNTS if number == 0 else 0):
            Account.objects.get_or_create(
                code=ledger.services.merchant_sub_code(currency, sub),
                defaults={"kind": main.kind, "currency": currency, "parent": main},
            )
    _merchant.set(None)


def _kill_after_preorder(
    execute: Callable, sql: str, params: Any, many: bool, context: Any
) -> Any:
    result = execute(sql, params, many, context)
    if sql.startswith('INSERT INTO "orders_preorder"'):
        # Runs at once in autocommit, after the COMMIT inside a transaction.
        transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))
    return result


class BenchMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        merchant = request.headers.get(MERCHANT_HEADER)
        token = _merchant.set(int(merchant) if merchant else None)
        try:
            if request.headers.get(CRASH_HEADER) == "after-commit":
                with connection.execute_wrapper(_kill_after_preorder):
                    return self.get_response(request)
            subs = request.headers.get(SUB_ACCOUNTS_HEADER)
            if subs:
                with override_settings(MERCHANT_SUB_ACCOUNTS=int(subs)):
                    return self.get_response(request)
            return self.get_response(request)
        finally:
            _merchant.reset(token)


class ReplayMiddlewareOutsideBench:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.replay = ReplayMiddleware(get_response)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith(CONTENDERS):
            return self.get_response(request)
        return self.replay(request)
