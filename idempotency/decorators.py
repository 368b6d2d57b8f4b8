"""Opt a view into idempotency: `@idempotent("orders.create")` on a DRF method.

```python
class OrderCreateApi(APIView):
    @idempotent("orders.create")
    def post(self, request): ...

class PayApi(APIView):
    @idempotent("orders.pay", phased=True)
    def post(self, request, merchant_order_no, idem: Phases): ...
```

`phased` may also be a function of the request (`phased=pays_with_provider`); a body
that it cannot parse is refused for its form before the engine runs.

Each endpoint is `"required"` (the default: no key, no service), `"optional"` (a
request without a key runs without the layer; one with a key gets all of it) or
`"off"`; `default=` sets it in code and the setting `IDEMPOTENCY_ENDPOINTS` (endpoint
name → mode) overrides it per deployment.
"""

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.http import HttpResponse
from rest_framework import exceptions
from rest_framework.authtoken.models import Token
from rest_framework.request import Request
from rest_framework.views import APIView

from . import metrics
from .engine import Call, Phases, execute, refuse_form
from .exceptions import IdempotencyKeyInvalid, IdempotencyKeyMissing, ProblemError
from .fastpath import credential_digest
from .fingerprint import (
    fingerprint,
    key_is_valid,
    legacy_fingerprints,
    request_key,
)
from .middleware import FAST_PATH
from .waiting import preferred_wait

# Refusals of the request's form (its JSON, its media type, its schema): decided before
# the endpoint began executing, so the engine stores nothing and frees the key.
FORM_ERRORS = (
    exceptions.ParseError,
    exceptions.UnsupportedMediaType,
    exceptions.ValidationError,
)


def _token_credential(request: Request) -> str:
    """The digest the replay middleware will look the caller up by: only for a request
    DRF authenticated with an API token, and from that token, never from raw input."""
    if isinstance(request.auth, Token):
        return credential_digest(f"Token {request.auth.key}")
    return ""


def describe(request: Request, endpoint: str, default: str = "required") -> Call | None:
    """Read and validate the key; None when the endpoint may run without one."""
    http = request._request  # (DRF's Request relays each attribute read to it)
    key = request_key(http.headers)
    mode = settings.IDEMPOTENCY_ENDPOINTS.get(endpoint, default)
    if mode == "off" or (key is None and mode == "optional"):
        return None
    if key is None:
        metrics.count("missing")
        raise IdempotencyKeyMissing()
    if not key_is_valid(key):
        metrics.count("invalid")
        raise IdempotencyKeyInvalid()
    method, path = http.method or "", http.path
    digest, fields = fingerprint(method, path, http.body)
    return Call(
        scope=f"user:{request.user.pk}",
        key=key,
        endpoint=endpoint,
        method=method,
        path=path,
        fingerprint=digest,
        fields=fields,
        credential=_token_credential(request),
        aliases=legacy_fingerprints(method, path, http.body),
    )


# The endpoint names declared with `@idempotent`, as their modules are imported (the
# URLconf imports every view): what the back office offers to filter records by.
ENDPOINTS: set[str] = set()


def idempotent(
    endpoint: str,
    *,
    phased: bool | Callable[[Request], bool] = False,
    default: str = "required",
) -> Callable:
    """Make a DRF view method take effect at most once per user and key.

    `phased` may be a function of the request, for an endpoint whose mode depends on
    what is asked (a payment that calls the provider runs in phases, one from the
    wallet in one transaction); it sees the parsed body.
    """
    ENDPOINTS.add(endpoint)

    def decorate(method: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(method)
        def wrapper(view: APIView, request: Request, *args: Any, **kwargs: Any) -> Any:
            def respond(response: Any) -> HttpResponse:
                # Render now: the engine stores the exact bytes the client receives.
                response = view.finalize_response(request, response, *args, **kwargs)
                if hasattr(response, "render"):
                    response.render()
                return response

            call = describe(request, endpoint, default)
            if callable(phased):  # the mode depends on the body: parse it first
                try:
                    in_phases = phased(request)
                except (exceptions.ParseError, exceptions.UnsupportedMediaType) as exc:
                    # Refused for its form before the engine runs: nothing stored.
                    return respond(view.handle_exception(exc))
            else:
                in_phases = phased

            def run(phases: Phases | None) -> HttpResponse:
                extra = {"idem": phases} if in_phases else {}
                try:
                    response = method(view, request, *args, **kwargs, **extra)
                except Exception as exc:
                    # Domain errors become their problem+json response here, so the
                    # refusal can be stored; anything else propagates as a 500.
                    response = view.handle_exception(exc)
                    if isinstance(exc, FORM_ERRORS) or (
                        isinstance(exc, ProblemError) and exc.refuses_form
                    ):
                        refuse_form(response)
                return respond(response)

            if call is None:
                # Without the layer a phased view still runs in phases, each its own
                # transaction (the view must never read "no phases" as "no outside
                # call": a provider payment was once paid from the wallet).
                return run(Phases.unrecorded() if in_phases else None)
            taken = getattr(request._request, FAST_PATH, None)
            wait = preferred_wait(request.headers.get("Prefer"))
            return execute(call, run, phased=in_phases, taken=taken, wait=wait)

        # Read by the OpenAPI schema (ledger.openapi) to document the header.
        wrapper.idempotency = {  # type: ignore[attr-defined]
            "endpoint": endpoint,
            "default": default,
            "phased": phased,
        }
        return wrapper

    return decorate
