"""The Redis fast path: a lock per key and a short-lived cache of finished responses.

Redis is an optimisation, never the truth. It lets a burst of duplicates get 409 or a
replay without touching the database; the database (the key's advisory lock, its
unique constraint) still decides who executes. Losing Redis (or its data, or a lock
whose lease ran out) therefore costs speed, never correctness.

Each request costs two round trips: a begin (replay from the cache, or take the lock,
or report who holds it) and `finish` (cache the response, release our lock). The begin
is usually made by the replay middleware, before Django authenticates the caller
(`begin_for_credential`); the engine adopts the lock it took. Only a caller Redis does
not know yet pays for the engine's own `begin`.
"""

import contextlib
import hashlib
import logging
import secrets
import time
from dataclasses import dataclass
from functools import cache
from typing import Any

import redis as redis_lib
from redis.commands.core import Script

from .redis import get_redis
from .responses import StoredResponse

logger = logging.getLogger(__name__)

# KEYS: lock, response. ARGV: token, lease ms.
# Returns {1, cached} | {2} (we took the lock) | {3} (another request holds it).
_BEGIN = """
local cached = redis.call('GET', KEYS[2])
if cached then return {1, cached} end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {2} end
return {3}
"""

# KEYS: lock, response, credential. ARGV: token, response or '', cache ms, scope,
# credential ms, revoked mark, done channel. Only the holder deletes the lock: one
# whose lease ran out must not free a successor's. The lock goes first: a write that
# fails (Redis out of memory) stops the script, and must not leave the key locked for
# a whole lease. A cache time of 0 caches nothing. The credential entry lets
# `begin_for_credential` find this caller's scope; a revoked credential's mark is
# never overwritten (the request may have been authenticated before the revocation).
# Last, the finish is announced on the key's channel to anyone waiting (`Prefer:
# wait`); with no subscriber that costs nothing.
_FINISH = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
if ARGV[2] ~= '' and tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
if KEYS[3] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[6] then
  redis.call('SET', KEYS[3], ARGV[4], 'PX', ARGV[5])
end
redis.call('PUBLISH', ARGV[7], '1')
return 1
"""

# KEYS: credential. ARGV: key hash, token, lease ms, lock prefix, response prefix,
# revoked mark. `_BEGIN` for a caller known only by a digest of its credential.
# Returns {0} (unknown or revoked caller) or `_BEGIN`'s answer with the caller's scope
# appended: {1, cached, scope} | {2, scope} | {3, scope}.
# (It names keys from the first key's value, which a Redis Cluster would refuse; this
# project runs a single Redis, where one round trip is the point.)
_BEGIN_FOR_CREDENTIAL = """
local scope = redis.call('GET', KEYS[1])
if not scope or scope == ARGV[6] then return {0} end
local cached = redis.call('GET', ARGV[5] .. scope .. ':' .. ARGV[1])
if cached then return {1, cached, scope} end
local lock = ARGV[4] .. scope .. ':' .. ARGV[1]
if redis.call('SET', lock, ARGV[2], 'NX', 'PX', ARGV[3]) then return {2, scope} end
return {3, scope}
"""

# How long a credential → scope entry lives. Revoking a token replaces its entry at
# once (`credential_revoke`); this bounds only a revocation Redis did not hear of.
CREDENTIAL_MS = 60_000
# What a revoked credential's entry holds instead of a scope (no scope looks like it),
# and for how long: longer than any request the token sent before it was revoked.
REVOKED, REVOKED_MS = "revoked", 86_400_000
CREDENTIAL_PREFIX = "idem:cred:"


@dataclass
class FastPath:
    """One request's view of the Redis fast path."""

    available: bool
    locked: bool = False  # we hold the Redis lock
    cached: StoredResponse | None = None
    busy: bool = False  # another request holds the lock
    token: str = ""
    lock_key: str = ""
    response_key: str = ""
    scope: str = ""
    key: str = ""

    def belongs_to(self, scope: str, key: str) -> bool:
        return self.available and (self.scope, self.key) == (scope, key)


@cache
def _scripts(client: redis_lib.Redis) -> tuple[Script, Script, Script]:
    """The scripts, sent by SHA (EVALSHA) after the first call on a server."""
    return (
        client.register_script(_BEGIN),
        client.register_script(_FINISH),
        client.register_script(_BEGIN_FOR_CREDENTIAL),
    )


LOCK_PREFIX, RESPONSE_PREFIX = "idem:lock:", "idem:resp:"
# A request that finishes publishes on its key's channel, for `Prefer: wait`.
DONE_PREFIX = "idem:done:"


def _key_hash(key: str) -> str:
    # Keys may be 255 characters of anything printable: hash them into a fixed shape.
    return hashlib.sha256(key.encode()).hexdigest()[:40]


def _outcome(scope: str, key: str, token: str, reply: Any) -> FastPath:
    """A begin script's answer, {1, cached} | {2} | {3}, for the key in `scope`."""
    digest = _key_hash(key)
    fast = FastPath(
        available=True,
        token=token,
        lock_key=f"{LOCK_PREFIX}{scope}:{digest}",
        response_key=f"{RESPONSE_PREFIX}{scope}:{digest}",
        scope=scope,
        key=key,
    )
    if reply[0] == 1:
        fast.cached = StoredResponse.loads(reply[1])
    elif reply[0] == 2:
        fast.locked = True
    else:
        fast.busy = True
    return fast


def credential_digest(authorization: str | None) -> str:
    """A digest of an `Authorization: Token ...` header; '' for anything else."""
    if not authorization or not authorization.startswith("Token "):
        return ""
    return hashlib.sha256(authorization.encode()).hexdigest()[:40]


def begin(scope: str, key: str, lease_ms: int) -> FastPath:
    """Replay from the cache, or take the lock, or learn who holds it.

    Raises `redis.RedisError` when Redis is configured but unreachable; returns an
    unavailable FastPath when Redis is not configured at all.
    """
    client = get_redis()
    if client is None:
        return FastPath(available=False)
    token, digest = secrets.token_hex(8), _key_hash(key)
    begin_script, _, _ = _scripts(client)
    reply: Any = begin_script(
        keys=[f"{LOCK_PREFIX}{scope}:{digest}", f"{RESPONSE_PREFIX}{scope}:{digest}"],
        args=[token, lease_ms],
    )
    return _outcome(scope, key, token, reply)


def begin_for_credential(credential: str, key: str, lease_ms: int) -> FastPath | None:
    """`begin` for a caller known by the digest of its API token, before anyone has
    authenticated it: the token maps to the scope the engine last saw it use (see
    `finish`). None for a caller Redis does not know (or when Redis fails): the engine
    then makes its own `begin`.
    """
    client = get_redis()
    if client is None or not credential:
        return None
    token, digest = secrets.token_hex(8), _key_hash(key)
    _, _, begin_script = _scripts(client)
    try:
        reply: Any = begin_script(
            keys=[f"{CREDENTIAL_PREFIX}{credential}"],
            args=[digest, token, lease_ms, LOCK_PREFIX, RESPONSE_PREFIX, REVOKED],
        )
    except redis_lib.RedisError:
        return None
    if reply[0] == 0:
        return None
    return _outcome(reply[-1].decode(), key, token, reply)


def finish(
    fast: FastPath,
    stored: StoredResponse | None,
    cache_ms: int,
    *,
    scope: str = "",
    credential: str = "",
) -> None:
    """Cache the finished response (if any) and release our lock; best effort.

    A finished response also maps the caller's credential to its scope, which is how
    `begin_for_credential` knows the caller next time.
    """
    client = get_redis()
    if client is None or not fast.available or not (fast.locked or stored):
        return
    payload = stored.dumps() if stored else ""
    # On a Redis error the lock expires by itself; the database holds the response.
    _, finish_script, _ = _scripts(client)
    credential_key = f"{CREDENTIAL_PREFIX}{credential}" if stored and credential else ""
    fast.locked = False
    with contextlib.suppress(redis_lib.RedisError):
        finish_script(
            keys=[fast.lock_key, fast.response_key, credential_key],
            args=[
                fast.token,
                payload,
                cache_ms,
                scope,
                CREDENTIAL_MS,
                REVOKED,
                _done_channel(fast.scope, fast.key),
            ],
        )


def _done_channel(scope: str, key: str) -> str:
    return f"{DONE_PREFIX}{scope}:{_key_hash(key)}"


def wait_for_finish(scope: str, key: str, seconds: float) -> bool:
    """Sleep until the request holding the key's Redis lock finishes (its `finish`
    publishes on the key's channel) or `seconds` pass; True if Redis did the waiting.
    False when there is no Redis, it fails, or it holds no lock for the key (lost, or
    never taken): the caller then waits on the database."""
    client = get_redis()
    if client is None or seconds <= 0:
        return False
    deadline = time.monotonic() + seconds
    try:
        with client.pubsub(ignore_subscribe_messages=True) as pubsub:
            pubsub.subscribe(_done_channel(scope, key))
            # Subscribed first, then looked: a finish in between is not missed.
            if not client.exists(f"{LOCK_PREFIX}{scope}:{_key_hash(key)}"):
                return False
            while (left := deadline - time.monotonic()) > 0:
                if pubsub.get_message(timeout=left) is not None:
                    break
    except redis_lib.RedisError:
        return False
    return True


def credential_revoke(authorization: str) -> None:
    """Forget an `Authorization` value at once: the replay shortcut no longer knows
    it, and a request it sent before (still running) cannot teach it again.

    Best effort: with Redis unreachable, the entry it could not replace lives at most
    `CREDENTIAL_MS`.
    """
    client = get_redis()
    credential = credential_digest(authorization)
    if client is None or not credential:
        return
    try:
        client.set(f"{CREDENTIAL_PREFIX}{credential}", REVOKED, px=REVOKED_MS)
    except redis_lib.RedisError:
        logger.warning("could not revoke a credential in Redis", exc_info=True)


def release(fast: FastPath) -> None:
    """Give back a lock nobody used (best effort; it would expire by itself)."""
    if fast.locked:
        finish(fast, None, 0)
