"""Operational endpoints: liveness, readiness and metrics; and /favicon.ico."""

import hmac
import os
from collections.abc import Callable
from functools import wraps

from django.conf import settings
from django.db import connection
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponsePermanentRedirect,
    JsonResponse,
)
from django.templatetags.static import static
from django.views.decorators.csrf import csrf_exempt

from .problems import problem_response

View = Callable[..., HttpResponse]


def get_only(view: View) -> View:
    """GET and HEAD only: any other method is `405 method_not_allowed`, in
    problem+json with `Allow`, whatever cookies came with it (nothing here changes
    state, so no CSRF check stands before that answer)."""

    @csrf_exempt
    @wraps(view)
    def only_get(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        if request.method not in ("GET", "HEAD"):
            response = problem_response(
                405,
                "method_not_allowed",
                "Method not allowed",
                f"{request.method} is not allowed here; use GET.",
            )
            response["Allow"] = "GET, HEAD"
            return response
        return view(request, *args, **kwargs)

    return only_get


@get_only
def favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask for /favicon.ico whatever the page's links say: send them to
    the static file, which whitenoise serves."""
    return HttpResponsePermanentRedirect(static("favicon.ico"))


@get_only
def healthz(request: HttpRequest) -> JsonResponse:
    """The process is up and serving; checks nothing else on purpose."""
    return JsonResponse({"status": "ok"})


@get_only
def readyz(request: HttpRequest) -> JsonResponse:
    """Ready to take traffic: the database answers, and Redis too when configured.

    Not ready: `503 not_ready` in problem+json, its `checks` naming what failed."""
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:  # any failure means "not ready", never a 500
        checks["database"] = f"error: {exc.__class__.__name__}"
    if settings.REDIS_URL:
        from idempotency.redis import redis_ping

        checks["redis"] = "ok" if redis_ping() else "error: unreachable"
    if all(value == "ok" for value in checks.values()):
        return JsonResponse({"status": "ok", "checks": checks})
    # Like every other error body, problem details; `status` stays the HTTP status
    # (RFC 9457), `checks` says which dependency failed.
    failed = ", ".join(name for name, value in checks.items() if value != "ok")
    return problem_response(
        503,
        "not_ready",
        "Not ready",
        f"Not ready to take traffic: {failed} unreachable.",
        checks=checks,
    )


@get_only
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text format, summed over every process that writes to
    PROMETHEUS_MULTIPROC_DIR (all web workers and the Celery worker under `make run`
    and compose). With METRICS_TOKEN set, only `Authorization: Bearer <token>`."""
    if settings.METRICS_TOKEN and not _bearer_matches(request, settings.METRICS_TOKEN):
        response = problem_response(
            401,
            "metrics_token_required",
            "Metrics need a token",
            "Send Authorization: Bearer <METRICS_TOKEN>.",
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    import prometheus_client
    from prometheus_client import multiprocess

    from .metrics import SCRAPE_COLLECTORS

    registry = prometheus_client.REGISTRY
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        registry = prometheus_client.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    # Read from the database now, in this process: not a per-process sample.
    database = prometheus_client.CollectorRegistry(auto_describe=False)
    for collector in SCRAPE_COLLECTORS:
        database.register(collector)
    return HttpResponse(
        prometheus_client.generate_latest(registry)
        + prometheus_client.generate_latest(database),
        content_type=prometheus_client.CONTENT_TYPE_LATEST,
    )


def _bearer_matches(request: HttpRequest, token: str) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )
