"""Begin idempotent requests in Redis before the rest of the stack runs.

A retry of a finished request is the commonest thing an idempotent API sees, and the
cheapest to answer: the response is already in the Redis cache. Going through every
middleware, URL routing, DRF and a token lookup in the database first would cost more
than the original write did. This middleware, early in `MIDDLEWARE`, makes the fast
path's begin in one Redis round trip instead (`fastpath.begin_for_credential`; two on a
Redis Cluster, where the caller's scope is read before the key's lock and cache):

* only for a mutating request with an `Idempotency-Key` and an API token;
* the token's digest maps to the caller's scope (written by the engine when a request
  of a caller Redis did not know finished, kept for `fastpath.CREDENTIAL_MS`, and
  replaced by a "revoked" mark the moment the token is revoked:
  `idempotency/signals.py`), so nobody but the key's owner can be answered, and an
  unknown or revoked token never is;
* a cached response is replayed only when the fingerprint (method, path, canonical
  body) matches the stored one;
* otherwise the lock the same round trip took is handed to the engine on the request
  (`FAST_PATH`), so a first execution makes no second begin; if no idempotent view
  adopts it (another endpoint, a failed authentication), it is released here.

Anything else, including any Redis error, falls through to the ordinary path, which
answers the same way, only slower. So this is purely a shortcut: removing it from
`MIDDLEWARE` changes speed, not behaviour.
"""

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from . import fastpath
from .fingerprint import (
    fingerprint,
    key_is_valid,
    legacy_fingerprints,
    request_key,
)
from .responses import replay

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# The request attribute that carries a lock taken here to the engine.
FAST_PATH = "idempotency_fast_path"


class ReplayMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        fast = self.begin(request)
        if fast is None:
            return self.get_response(request)
        if fast.cached is not None:
            method, path, body = request.method or "", request.path, request.body
            digest, _ = fingerprint(method, path, body)
            if fast.cached.fingerprint in (
                digest,
                *legacy_fingerprints(method, path, body),
            ):
                return replay(fast.cached)
            return self.get_response(request)  # the engine answers 422
        if not fast.locked:
            return self.get_response(request)  # busy: the engine answers 409
        setattr(request, FAST_PATH, fast)
        try:
            return self.get_response(request)
        finally:
            fastpath.release(fast)  # a no-op when the engine finished with it

    @staticmethod
    def begin(request: HttpRequest) -> fastpath.FastPath | None:
        if request.method not in MUTATING or not settings.REDIS_URL:
            return None
        key = request_key(request.headers)
        credential = fastpath.credential_digest(request.headers.get("Authorization"))
        if not key or not credential or not key_is_valid(key):
            return None
        lease_ms = settings.IDEMPOTENCY_LEASE_SECONDS * 1000
        return fastpath.begin_for_credential(credential, key, lease_ms)
