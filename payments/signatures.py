"""Signed provider callbacks: `X-Provider-Signature: t=<unix>,n=<nonce>,v1=<hex>`.

`v1` is HMAC-SHA256(secret, "<t>.<n>.<raw body>"). A callback is accepted only if the
MAC matches (constant-time compare), `t` is within the tolerance of now, and the nonce
was never seen before, so a captured callback replayed as is gets a 401. The nonces
live in the `CallbackNonce` table, claimed with one `INSERT ... ON CONFLICT DO
NOTHING`: the database, not Redis, is the truth here too, so losing Redis can never
let a replay through.
"""

import hashlib
import hmac
import re
import secrets
import time
from datetime import timedelta

from idempotency.sql import DatabaseNow, delete_in_batches, insert_unless_exists

from .exceptions import CallbackSignatureInvalid
from .models import CallbackNonce

HEADER = "X-Provider-Signature"
TOLERANCE_SECONDS = 300
# Each part once, in this order, none empty. A nonce is any 1..128 printable ASCII
# characters but a comma or a space. Matched whole (`fullmatch`: `$` would let a
# line break follow) and in ASCII (`\d` would take any script's digits, which
# `int()` reads as the same timestamp).
_PARTS = re.compile(r"t=([0-9]{1,12}),n=([!-+\--~]{1,128}),v1=([0-9a-fA-F]{64})")


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
    """Mark `nonce` used until `ttl_seconds` from now by the database's clock (as
    the purge reads it: hosts' clocks differ); False if it was used before."""
    return insert_unless_exists(
        CallbackNonce(nonce=nonce),
        ["nonce"],
        clock={"expires_at": timedelta(seconds=ttl_seconds)},
    )


def nonce_purge_expired(*, batch: int = 1000) -> int:
    """Delete nonces expired by the database's clock, in batches; return how many
    went."""
    expired = CallbackNonce.objects.filter(expires_at__lte=DatabaseNow())
    return delete_in_batches(expired, batch_size=batch)


def signature_verify(*, header: str | None, body: bytes, secret: str) -> None:
    """Raise `CallbackSignatureInvalid` unless the header signs `body` freshly."""
    match = _PARTS.fullmatch(header or "")
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
