"""The same key store for Celery tasks and plain calls as for HTTP requests.

```python
from idempotency.calls import idempotent_call, idempotent_task

receipt = idempotent_call("receipts", f"order:{order_id}", lambda: send(order_id),
                          request={"order": order_id})

@idempotent_task(key=lambda order_id: f"ship:{order_id}")
def ship(order_id: int) -> dict: ...
```

A call runs through the engine's atomic mode: the function's database work and the key
record commit in one transaction, its (JSON) result is stored, and a second call with
the key, even a concurrent one, returns the stored result instead of running again. An
exception rolls everything back and stores nothing, so a retry runs it afresh. A second
call with the key but other `request` data is a bug: `IdempotencyKeyReused`.
"""

import hashlib
import json
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from celery import shared_task
from django.http import HttpResponse

from .engine import execute
from .exceptions import IdempotencyKeyInFlight
from .fingerprint import fingerprint, key_is_valid
from .records import Call

T = TypeVar("T")
CALL = "CALL"  # the method a call is recorded under, beside HTTP's


def idempotent_call(
    scope: str,
    key: str,
    fn: Callable[[], T],
    *,
    request: Any = None,
    wait: int = 10,
) -> T:
    """Run `fn` at most once for (`scope`, `key`) and return its result, or the result
    stored by the call that ran it. A call with the key still running is waited for
    up to `wait` seconds, then `IdempotencyKeyInFlight` is raised."""
    if not key_is_valid(key):
        raise ValueError("a key is 1 to 255 printable ASCII characters")
    body = json.dumps(request, sort_keys=True, default=str).encode()
    digest, fields = fingerprint(CALL, scope, body)
    call = Call(
        scope=scope,
        key=key,
        endpoint=scope,
        method=CALL,
        path=scope,
        fingerprint=digest,
        fields=fields,
    )

    def run(_phases: object) -> HttpResponse:
        return HttpResponse(
            json.dumps(fn()), status=200, content_type="application/json"
        )

    return json.loads(execute(call, run, wait=wait).content)


def _arguments_key(name: str, args: tuple, kwargs: dict) -> str:
    canonical = json.dumps([args, kwargs], sort_keys=True, default=str)
    return f"{name}:{hashlib.sha256(canonical.encode()).hexdigest()}"


def idempotent_task(
    *, key: Callable[..., str] | None = None, wait: int = 10, **options: Any
) -> Callable:
    """A Celery task whose body runs once per key, however often it is delivered.

    The key comes from `key(*args, **kwargs)`, or from the arguments themselves (a
    digest of them), or is given explicitly as `idempotency_key=` when the task is
    sent. A delivery that finds the key in flight waits for it, then retries later.
    """

    def decorate(fn: Callable[..., Any]) -> Any:
        name = options.pop("name", f"{fn.__module__}.{fn.__name__}")

        @shared_task(bind=True, name=name, **options)
        @wraps(fn)
        def task(
            self: Any, *args: Any, idempotency_key: str | None = None, **kwargs: Any
        ) -> Any:
            chosen = idempotency_key or (
                key(*args, **kwargs) if key else _arguments_key(name, args, kwargs)
            )
            try:
                return idempotent_call(
                    f"task:{name}",
                    chosen,
                    lambda: fn(*args, **kwargs),
                    request=[args, kwargs],
                    wait=wait,
                )
            except IdempotencyKeyInFlight as exc:
                raise self.retry(countdown=1, exc=exc) from exc

        return task

    return decorate
