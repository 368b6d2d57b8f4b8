"""One middleware for what operators see of every request: its id, metrics, log line.

Outermost in MIDDLEWARE, so it times and counts everything, errors included. The
request id is the caller's (or nginx's) `X-Request-ID` when it is sane, otherwise a
fresh one; it is echoed in the response's `X-Request-ID`. The log line carries the
idempotency key only as a SHA-256 prefix, never the key itself.
"""

import logging
import re
import time
import uuid
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.urls import Resolver404, resolve

from idempotency import metrics as idempotency_metrics

from . import metrics
from .logging import key_digest

log = logging.getLogger("ledger.requests")
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}\Z")
METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}


def request_id_of(request: HttpRequest) -> str:
    given = request.headers.get("X-Request-ID", "")
    return given if REQUEST_ID.match(given) else uuid.uuid4().hex


def route_of(request: HttpRequest) -> str:
    """The URL's name (or pattern): bounded cardinality, unlike the raw path."""
    match = request.resolver_match
    if match is None:  # answered before URL resolution (e.g. a replay) or a 404
        try:
            match = resolve(request.path_info, getattr(request, "urlconf", None))
        except Resolver404:
            return "unmatched"
    return match.url_name or match.route or match.view_name


def user_id_of(request: HttpRequest) -> int | None:
    user = getattr(request, "user", None)  # DRF sets it after token auth
    if user is not None and user.is_authenticated:
        return user.pk
    return None


class RequestLogMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request_id = request_id_of(request)
        request.request_id = request_id  # type: ignore[attr-defined]
        outcomes: list[str] = []
        token = idempotency_metrics.current_outcomes.set(outcomes)
        started = time.perf_counter()
        try:
            response = self.get_response(request)
        finally:
            idempotency_metrics.current_outcomes.reset(token)
        duration = time.perf_counter() - started
        response["X-Request-ID"] = request_id
        method = request.method if request.method in METHODS else "OTHER"
        route = route_of(request)
        metrics.http_requests.labels(method, route, str(response.status_code)).inc()
        metrics.http_duration.labels(method, route).observe(duration)
        log.info(
            "http_request",
            extra={
                "event": "http_request",
                "request_id": request_id,
                "method": method,
                "path": request.path,
                "route": route,
                "status": response.status_code,
                "duration_ms": round(duration * 1000, 1),
                "user_id": user_id_of(request),
                "idempotency_key_sha256": key_digest(
                    request.headers.get("Idempotency-Key")
                ),
                "idempotency_outcome": outcomes[-1] if outcomes else None,
            },
        )
        return response
