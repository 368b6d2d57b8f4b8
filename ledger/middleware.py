"""Middleware of the project: what operators see of every request, and what no
request may carry.

`RequestLogMiddleware`, outermost in MIDDLEWARE, times and counts everything, errors
included. The request id is the caller's (or nginx's) `X-Request-ID` when it is sane,
otherwise a fresh one; it is echoed in the response's `X-Request-ID`. The log line
carries the idempotency key only as a SHA-256 prefix, never the key itself.

`RequestLimitsMiddleware`, next, refuses what no view could answer, before any view
or the idempotency layer sees it (so nothing is stored under its key).

`ProbeMiddleware`, after `SecurityMiddleware` (whose headers its answers carry like
any other), answers the health, readiness and metrics probes.

`ApiLanguageMiddleware`, after `LocaleMiddleware`, has the API answer in English
whatever the caller's `Accept-Language` (the pages for people keep theirs).
"""

import io
import logging
import re
import time
import uuid
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.core.handlers.wsgi import LimitedStream
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.http import Http404, HttpRequest, HttpResponse, UnreadablePostError
from django.urls import Resolver404, resolve
from django.utils import translation

from idempotency import metrics as idempotency_metrics
from idempotency.fingerprint import request_key

from . import metrics
from .logging import key_digest
from .problems import (
    RequestBodyIncomplete,
    domain_error_response,
    problem_response,
)

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
        return _route_of_path(request.path_info, getattr(request, "urlconf", None))
    return match.url_name or match.route or match.view_name


@lru_cache(maxsize=4096)
def _route_of_path(path: str, urlconf: str | None) -> str:
    """A path's route, for a request answered before URL resolution: a replay (whose
    retries repeat the path, so the last few thousand paths are remembered) or a 404.
    """
    try:
        match = resolve(path, urlconf)
    except Resolver404:
        return "unmatched"
    return match.url_name or match.route or match.view_name


@receiver(setting_changed)
def _forget_routes(*, setting: str, **kwargs: Any) -> None:
    if setting == "ROOT_URLCONF":  # (as Django forgets its own URL caches)
        _route_of_path.cache_clear()


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
                "idempotency_key_sha256": key_digest(request_key(request.headers)),
                "idempotency_outcome": outcomes[-1] if outcomes else None,
            },
        )
        return response


class RequestLimitsMiddleware:
    """Refuse a request no view can answer, before any of them runs.

    * A NUL byte in the URL, in the path or the query string: `404`. No resource is
      named so, and PostgreSQL text cannot hold NUL: the lookup a view made with it
      would fail (a 500). One check here covers every route, present and future.
    * A body over `DATA_UPLOAD_MAX_MEMORY_SIZE`: `413 payload_too_large`, having read
      no more of it than the limit. `Content-Length` says so up front, and nothing is
      read. A chunked body (no `Content-Length`; gunicorn passes it on as a stream
      that Django would not read at all) is read up to the limit and one byte more,
      then handed on as a body of known length if it fits.
    * A body in a content coding (`Content-Encoding: gzip`): `415
      unsupported_media_type`. Nothing here decodes one, and read as it is the
      compressed bytes would be no JSON: refused before any view, the key free.
    * A body shorter than its `Content-Length` (the client closed the connection
      mid-upload), or a chunked body that cannot be read to its end (cut short, or
      its chunks malformed): `400 request_body_incomplete`. It is read here, whole,
      before any view sees a part of it.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path_info or has_nul(request.META.get("QUERY_STRING")):
            raise Http404("NUL in the URL")
        coding = request.META.get("HTTP_CONTENT_ENCODING", "").strip().lower()
        if request.method in BODY_METHODS and coding not in ("", "identity"):
            return problem_response(
                415,
                "unsupported_media_type",
                "Unsupported media",
                f"A body in Content-Encoding {coding!r} is not read here; send it "
                "as it is, without a Content-Encoding.",
            )
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        length = body_length(request, limit)
        if length is None:
            return domain_error_response(RequestBodyIncomplete())
        if limit is not None and length > limit:
            return problem_response(
                413,
                "payload_too_large",
                "Payload too large",
                f"The request body is larger than {limit} bytes.",
            )
        if request.method in BODY_METHODS and not body_complete(request):
            return domain_error_response(RequestBodyIncomplete())
        return self.get_response(request)


# The methods whose body a view reads (a GET's declared body is never waited for).
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def body_complete(request: HttpRequest) -> bool:
    """Read the declared body now: False if the connection ended before all of it
    came (closed, or reset: `UnreadablePostError`)."""
    declared = declared_length(request)
    if not declared:
        return True
    try:
        return len(request.body) >= declared
    except UnreadablePostError:
        return False


def has_nul(query: str | None) -> bool:
    if not query:
        return False
    return "\x00" in query or "%00" in query


def declared_length(request: HttpRequest) -> int:
    """The body's `Content-Length`; 0 when there is none or it is no number (so
    Django reads it too: as no body)."""
    try:
        return max(0, int(request.META.get("CONTENT_LENGTH") or 0))
    except ValueError:
        return 0


def body_length(request: HttpRequest, limit: int | None) -> int | None:
    """The body's length as declared; of a chunked body, what was read of it (None
    when it could not be read)."""
    if request.META.get("CONTENT_LENGTH"):
        return declared_length(request)
    encoding = request.META.get("HTTP_TRANSFER_ENCODING", "")
    stream = request.META.get("wsgi.input")
    if stream is None or "chunked" not in encoding.lower():
        return 0
    return read_chunked(request, stream, limit)


def read_chunked(request: HttpRequest, stream: Any, limit: int | None) -> int | None:
    """Read a chunked body up to `limit` + 1 bytes (all of it with no limit); if it
    fits, make it the request's
    body, with a length, as Django reads one. None when it cannot be read: the
    connection ended before its last chunk, or a chunk is malformed (the server's
    reader raises; gunicorn's `NoMoreData` is an `OSError`, a bad chunk one of its
    `ParseException`s, neither of which this module may name)."""
    try:
        body = stream.read() if limit is None else stream.read(limit + 1)
    except Exception:  # any failure to read it: no body to run on
        return None
    if limit is None or len(body) <= limit:
        request.META["CONTENT_LENGTH"] = str(len(body))
        readable = LimitedStream(io.BytesIO(body), len(body))
        request._stream = readable  # type: ignore[assignment]
    return len(body)


class ProbeMiddleware:
    """`/healthz`, `/readyz` and `/metrics` answer whatever `Host` they are asked by.

    A load balancer's health check and Prometheus's scrape name this host by its
    address (`Host: 10.0.3.7:8000`), which ALLOWED_HOSTS need not list: Django's
    check of the Host header guards the URLs and cookies an answer builds from it,
    and these build none. Django checks it when a middleware first asks for the host,
    which `CommonMiddleware` does on every request, so the probes are answered here,
    before it, but after `SecurityMiddleware`, which reads no host and puts its
    headers (nosniff, Referrer-Policy, ...) on these answers too; still timed,
    counted and logged by `RequestLogMiddleware`.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        from .urls import PROBES

        self.get_response = get_response
        self.probes = {f"/{name}": view for name, view in PROBES.items()}

    def __call__(self, request: HttpRequest) -> HttpResponse:
        probe = self.probes.get(request.path_info)
        if probe is not None:
            return probe(request)
        return self.get_response(request)


class ApiLanguageMiddleware:
    """The API speaks English, whatever `Accept-Language` asks for.

    Its answers are read by programs, by their stable `code`; a person reads the
    problem's `title` and `detail`. Under `LocaleMiddleware` alone, a caller asking
    for Chinese got Django's and DRF's own messages (a field's "This field is
    required.") in Chinese and the project's titles and details in English, in one
    body that said `Content-Language: zh-hans`. And an idempotent answer is stored
    once and replayed byte for byte: its language would be the first request's,
    whatever the retry asked for. So under `/api/` the language is English, and
    the answer says so; the shop, the pay page and the admin keep the reader's.
    """

    PREFIX = "/api/"

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path_info.startswith(self.PREFIX):
            translation.activate(settings.LANGUAGE_CODE)
            request.LANGUAGE_CODE = settings.LANGUAGE_CODE  # type: ignore[attr-defined]
        return self.get_response(request)
