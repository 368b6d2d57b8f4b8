"""RFC 9457 problem details: the one shape of every error body the app returns."""

import logging
from typing import Any
from urllib.parse import urlsplit

from django.contrib import admin
from django.core.exceptions import DisallowedHost
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseServerError,
    JsonResponse,
)
from django.shortcuts import render
from django.template import loader
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.response import Response

from idempotency.exceptions import ProblemError

PROBLEM_CONTENT_TYPE = "application/problem+json"

logger = logging.getLogger(__name__)


class RequestBodyIncomplete(ProblemError):
    """The connection ended before the body its `Content-Length` declared, or a
    chunked body could not be read to its last chunk: the client gave up
    mid-upload (what arrived may even parse: a JSON object cut after its last
    member), or sent chunks that are no chunks. Nothing runs on it
    (`ledger.middleware`)."""

    status = 400
    code = "request_body_incomplete"
    title = "Request body incomplete"
    default_detail = (
        "The body ended before its declared end (its Content-Length, or a chunked "
        "body's last chunk), or its chunks could not be read; nothing was done."
    )


# The codes of answers made outside DRF's exception handler, by HTTP status: by the
# error views below, the request limits (ledger.middleware), gunicorn's own refusals
# (ledger.server_errors) and the bundled nginx (deploy/nginx.conf).
HTTP_CODES = {
    400: "bad_request",
    404: "not_found",
    413: "payload_too_large",
    414: "uri_too_long",
    417: "expectation_failed",
    431: "request_header_fields_too_large",
    500: "internal_error",
    501: "not_implemented",
    502: "bad_gateway",
    503: "service_unavailable",
    504: "gateway_timeout",
}


def problem(
    status_code: int, code: str, title: str, detail: str = "", **extra: Any
) -> dict[str, Any]:
    return {
        "type": f"/problems/{code}",
        "title": title,
        "status": status_code,
        "detail": detail or title,
        "code": code,
        **extra,
    }


def problem_response(
    status_code: int, code: str, title: str, detail: str = "", **extra: Any
) -> JsonResponse:
    """A problem+json response for plain Django views and middleware."""
    body = problem(status_code, code, title, detail, **extra)
    return JsonResponse(body, status=status_code, content_type=PROBLEM_CONTENT_TYPE)


def domain_error_response(exc: ProblemError) -> JsonResponse:
    response = problem_response(
        exc.status, exc.code, exc.title, exc.detail, **exc.extra
    )
    for name, value in getattr(exc, "headers", {}).items():
        response[name] = value
    return response


_DRF_CODES = {
    exceptions.ValidationError: ("validation_error", "Invalid input"),
    exceptions.ParseError: ("malformed_json", "Malformed request body"),
    exceptions.NotAuthenticated: ("not_authenticated", "Not authenticated"),
    exceptions.AuthenticationFailed: ("authentication_failed", "Authentication failed"),
    exceptions.PermissionDenied: ("permission_denied", "Permission denied"),
    exceptions.NotFound: ("not_found", "Not found"),
    exceptions.MethodNotAllowed: ("method_not_allowed", "Method not allowed"),
    exceptions.NotAcceptable: ("not_acceptable", "Not acceptable"),
    exceptions.UnsupportedMediaType: ("unsupported_media_type", "Unsupported media"),
    exceptions.Throttled: ("throttled", "Too many requests"),
}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Render domain errors and DRF's own errors as problem+json.

    Anything else is a bug: it propagates and becomes a 500 (also problem+json, see
    `server_error`), and the transaction it ran in rolls back.
    """
    if isinstance(exc, ProblemError):
        body = problem(exc.status, exc.code, exc.title, exc.detail, **exc.extra)
        return Response(
            body,
            status=exc.status,
            headers=getattr(exc, "headers", None),
            content_type=PROBLEM_CONTENT_TYPE,
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    if not isinstance(exc, exceptions.APIException):
        return None
    code, title = next(
        (v for cls, v in _DRF_CODES.items() if isinstance(exc, cls)),
        (exc.default_code, "Request failed"),
    )
    extra: dict[str, Any] = {}
    if isinstance(exc, exceptions.ValidationError):
        extra["errors"] = exc.detail
        detail = "One or more fields are invalid; see `errors`."
    else:
        detail = str(exc.detail)
    headers = {}
    auth_header = getattr(exc, "auth_header", None)
    if auth_header:
        headers["WWW-Authenticate"] = auth_header
    wait = getattr(exc, "wait", None)
    if wait is not None:
        headers["Retry-After"] = str(int(wait))
    body = problem(exc.status_code, code, title, detail, **extra)
    return Response(
        body,
        status=exc.status_code,
        headers=headers,
        content_type=PROBLEM_CONTENT_TYPE,
    )


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def _is_back_office(request: HttpRequest) -> bool:
    return request.path.startswith(reverse("admin:index"))


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler404: an API path gets problem+json; a page gets the shop's 404 page
    (templates/404.html), in its layout with a way back to the shop."""
    if not _is_api(request):
        return defaults.page_not_found(request, exception)
    return problem_response(status.HTTP_404_NOT_FOUND, "not_found", "Not found")


def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler403: a `PermissionDenied` raised outside DRF's views (whose own
    handler answers theirs). An API path gets problem+json, as DRF answers it; a
    back-office page (a staff member without the model's permission) gets the
    back office's own 403 page (templates/admin/403.html), which says why and
    links back to it; any other page gets the shop's (templates/403.html)."""
    if _is_back_office(request):
        context = {
            **admin.site.each_context(request),
            "title": gettext("Not allowed"),
            "username": request.user.get_username(),
        }
        return render(
            request, "admin/403.html", context, status=status.HTTP_403_FORBIDDEN
        )
    if not _is_api(request):
        return defaults.permission_denied(request, exception)
    return problem_response(
        status.HTTP_403_FORBIDDEN, "permission_denied", "Permission denied"
    )


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: an API path gets problem+json; a page gets the shop's 500 page
    (templates/500.html), rendered as Django renders it: with an empty context, no
    request, so that nothing it shows can query the database or fail again. Should
    it fail all the same (the fault is in the layout it extends), Django's bare
    page rather than no answer at all."""
    if not _is_api(request):
        try:
            return defaults.server_error(request)
        except Exception:
            logger.exception("the 500 page could not be rendered")
            return HttpResponseServerError(
                "<h1>Server Error (500)</h1>", content_type="text/html"
            )
    return problem_response(
        status.HTTP_500_INTERNAL_SERVER_ERROR,
        "internal_error",
        "Internal server error",
        "Something went wrong on our side; it is safe to retry with the same key.",
    )


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler400: a request refused before a view ran it (a Host header that
    ALLOWED_HOSTS does not list, too many form fields, ...) or by its view
    (`BadRequest`). An API path gets problem+json, `host_not_allowed` for the
    host, else `bad_request`; a page gets the shop's 400 page, rendered without
    the request, as Django's own is: the request may name a host this site is not
    served at, so the page mints no CSRF token or session for it and holds no
    form.

    With DEBUG on, Django answers a refused host with its debug page before this
    handler is asked, on any path, as it answers every other error in DEBUG; that
    is left so: the host is then most likely the developer's own, and the debug
    page names the setting (DJANGO_ALLOWED_HOSTS) to add it to."""
    host_refused = isinstance(exception, DisallowedHost)
    if _is_api(request):
        if host_refused:
            return problem_response(
                status.HTTP_400_BAD_REQUEST,
                "host_not_allowed",
                "Host not allowed",
                "The Host header names no site this server serves; nothing was done.",
            )
        return problem_response(
            status.HTTP_400_BAD_REQUEST, "bad_request", "Bad request"
        )
    page = loader.render_to_string("400.html", {"host_refused": host_refused})
    return HttpResponseBadRequest(page)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: a form posted from a page whose CSRF token is stale (the
    session changed in another tab: a log-in or log-out) gets a 403 page that says
    so and links back to the page it came from (its Referer when it is this
    site's): in the shop's layout, else to home; a back-office form in the back
    office's (templates/admin/csrf_failure.html, as its 403 page), else to its
    index. An API path gets problem+json, the answer DRF gives for a session
    request that fails the check."""
    if _is_api(request):
        return problem_response(
            status.HTTP_403_FORBIDDEN,
            "permission_denied",
            "Permission denied",
            f"CSRF Failed: {reason}" if reason else "CSRF Failed.",
        )
    back = _same_site_referer(request)
    if _is_back_office(request):
        context = {
            **admin.site.each_context(request),
            "title": gettext("Page out of date"),
            "back": back or reverse("admin:index"),
            "came_from_page": bool(back),
        }
        return render(
            request,
            "admin/csrf_failure.html",
            context,
            status=status.HTTP_403_FORBIDDEN,
        )
    return render(
        request,
        "csrf_failure.html",
        {"back": back or reverse("home"), "came_from_page": bool(back)},
        status=status.HTTP_403_FORBIDDEN,
    )


def _same_site_referer(request: HttpRequest) -> str | None:
    """The path (and query) of the request's Referer if it is a page of this site."""
    referer = request.headers.get("Referer", "")
    if not referer or not url_has_allowed_host_and_scheme(
        referer, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return None
    parts = urlsplit(referer)
    if not parts.netloc:  # only an absolute URL names its origin
        return None
    path = parts.path or "/"
    back = f"{path}?{parts.query}" if parts.query else path
    # The path alone is a link of its own: `//evil.example/x` (or `/\evil...`,
    # which browsers read alike) is another site's address.
    if not url_has_allowed_host_and_scheme(back, allowed_hosts=None):
        return None
    return back
