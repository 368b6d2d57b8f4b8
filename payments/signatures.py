"""Signed provider callbacks: `X-Provider-Signature: t=<unix>,n=<nonce>,v1=<hex>`.

`v1` is HMAC-SHA256(secret, "<t>.<n>.<raw body>"). A callback is accepted only if the
MAC matches (constant-time compare), `t` is within the tolerance of now, and the nonce
was never seen before (Redis `SET NX EX` when configured, the `CallbackNonce` table
otherwise), so a captured callback replayed as is gets a 401.
"""

import hashlib
import hmac
import re
import secrets
import time
from datetime import timedelta

import redis as redis_lib
from django.db import IntegrityError, transaction
from django.utils import timezone

from idempotency.redis import get_redis

from .exceptions import CallbackSignatureInvalid
from .models import CallbackNonce

HEADER = "X-Provider-Signature"
TOLERANCE_SECONDS = 300
# A nonce is any 1..128 printable ASCII characters but a comma or a space.
_PARTS = re.compile(r"^t=(\d{1,12}),n=([!-+\--~]{1,128}),v1=([0-9a-fA-F]{64})$")


def mac(secret: str, timestamp: int, nonce: str, body: bytes) -> str:
    signed = f"{timestamp}.{nonce}.".encode() + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def sign(
    *, secret: str, body: bytes, timestamp: int | None = None, nonce: str = ""
) -> str:
    """The header value a provider sends with `body`."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    nonce = nonce or secrets.token_hex(16)
    return f"t={timestamp},n={nonce},v1={mac(secret, timestamp, nonce, body)}"


def nonce_claim(*, nonce: str, ttl_seconds: int) -> bool:
    """Mark `nonce` used; False if it was used before."""
    client = get_redis()
    if client is not None:
        try:
            return bool(
                client.set(f"callback-nonce:{nonce}", 1, nx=True, ex=ttl_seconds)
            )
        except redis_lib.RedisError:
            pass  # Redis is a fast path only: the table below is the fallback.
    try:
        with transaction.atomic():
            CallbackNonce.objects.create(
                nonce=nonce,
                expires_at=timezone.now() + timedelta(seconds=ttl_seconds),
            )
    except IntegrityError:
        return False
    return True


def nonce_purge_expired(*, batch: int = 1000) -> int:
    """Delete expired nonces in batches; return how many went."""
    deleted = 0
    while True:
        ids = list(
            CallbackNonce.objects.filter(expires_at__lte=timezone.now()).values_list(
                "pk", flat=True
            )[:batch]
        )
        if not ids:
            return deleted
        deleted += CallbackNonce.objects.filter(pk__in=ids).delete()[0]


def signature_verify(*, header: str | None, body: bytes, secret: str) -> None:
    """Raise `CallbackSignatureInvalid` unless the header signs `body` freshly."""
    match = _PARTS.match(header or "")
    if match is None:
        raise CallbackSignatureInvalid("Missing or malformed X-Provider-Signature.")
    timestamp, nonce, given = int(match[1]), match[2], match[3].lower()
    if not hmac.compare_digest(mac(secret, timestamp, nonce, body), given):
        raise CallbackSignatureInvalid("The signature does not match the body.")
    if abs(time.time() - timestamp) > TOLERANCE_SECONDS:
        raise CallbackSignatureInvalid(
            f"The signature's timestamp is more than {TOLERANCE_SECONDS} s from now."
        )
    # Twice the window: a nonce must outlive every timestamp that could carry it.
    if not nonce_claim(nonce=nonce, ttl_seconds=2 * TOLERANCE_SECONDS):
        raise CallbackSignatureInvalid("This signature's nonce was already used.")
