"""Replay finished requests from Redis before the rest of the stack runs.

A retry of a finished request is the commonest thing an idempotent API sees, and the
cheapest to answer: the response is already in the Redis cache. Going through every
middleware, URL routing, DRF and a token lookup in the database first would cost more
than the original write did. This middleware, first in `MIDDLEWARE`, answers it in one
Redis round trip instead:

* only for a mutating request with an `Idempotency-Key` and an API token;
* the token's digest maps to the caller's scope (written by the engine when one of the
  caller's requests finished, kept for `fastpath.CREDENTIAL_MS`), so nobody but the
  key's owner can be answered, and an unknown token never is;
* only when the fingerprint (method, path, canonical body) matches the stored one.

Anything else, including any Redis error, falls through to the ordinary path, which
answers the same way, only slower. So this is purely a shortcut: removing it from
`MIDDLEWARE` changes speed, not behaviour.
"""

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from .engine import replay
from .fastpath import credential_digest, peek
from .fingerprint import fingerprint, key_is_valid

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class ReplayMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.cached_replay(request) or self.get_response(request)

    @staticmethod
    def cached_replay(request: HttpRequest) -> HttpResponse | None:
        if request.method not in MUTATING or not settings.REDIS_URL:
            return None
        key = request.headers.get("Idempotency-Key")
        credential = credential_digest(request.headers.get("Authorization"))
        if not key or not credential or not key_is_valid(key):
            return None
        stored = peek(credential, key)
        if stored is None:
            return None
        digest, _ = fingerprint(request.method or "", request.path, request.body)
        return replay(stored) if stored.fingerprint == digest else None
