"""The Redis fast path: a lock per key and a short-lived cache of finished responses.

Redis is an optimisation, never the truth. It lets a burst of duplicates get 409 or a
replay without touching the database; the database's unique constraint still decides
who executes. Losing Redis (or its data) therefore costs speed, never correctness.

Each request costs two round trips: `begin` (replay from the cache, or take the lock,
or report who holds it) and `finish` (cache the response, release our lock).
"""

import base64
import contextlib
import hashlib
import json
import secrets
from dataclasses import dataclass
from functools import cache
from typing import Any

import redis as redis_lib
from redis.commands.core import Script

from .redis import get_redis

# KEYS: lock, response. ARGV: token, lease ms.
# Returns {1, cached} | {2} (we took the lock) | {3} (another request holds it).
_BEGIN = """
local cached = redis.call('GET', KEYS[2])
if cached then return {1, cached} end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {2} end
return {3}
"""

# KEYS: lock, response. ARGV: token, response or '', cache ms.
# Only the holder deletes the lock: one whose lease ran out must not free a successor's.
_FINISH = """
if ARGV[2] ~= '' then redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3]) end
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""


@dataclass(frozen=True)
class StoredResponse:
    fingerprint: str
    status: int
    headers: dict[str, str]
    body: bytes

    def dumps(self) -> str:
        return json.dumps(
            {
                "f": self.fingerprint,
                "s": self.status,
                "h": self.headers,
                "b": base64.b64encode(self.body).decode(),
            }
        )

    @classmethod
    def loads(cls, raw: bytes) -> "StoredResponse":
        data = json.loads(raw)
        return cls(data["f"], data["s"], data["h"], base64.b64decode(data["b"]))


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


@cache
def _scripts(client: redis_lib.Redis) -> tuple[Script, Script]:
    """Both scripts, sent by SHA (EVALSHA) after the first call on a server."""
    return client.register_script(_BEGIN), client.register_script(_FINISH)


def _names(scope: str, key: str) -> tuple[str, str]:
    # Keys may be 255 characters of anything printable: hash them into a fixed shape.
    digest = hashlib.sha256(f"{scope}\x00{key}".encode()).hexdigest()[:40]
    return f"idem:lock:{digest}", f"idem:resp:{digest}"


def begin(scope: str, key: str, lease_ms: int) -> FastPath:
    """Replay from the cache, or take the lock, or learn who holds it.

    Raises `redis.RedisError` when Redis is configured but unreachable; returns an
    unavailable FastPath when Redis is not configured at all.
    """
    client = get_redis()
    if client is None:
        return FastPath(available=False)
    lock_key, response_key = _names(scope, key)
    token = secrets.token_hex(8)
    begin_script, _ = _scripts(client)
    reply: Any = begin_script(keys=[lock_key, response_key], args=[token, lease_ms])
    fast = FastPath(
        available=True, token=token, lock_key=lock_key, response_key=response_key
    )
    if reply[0] == 1:
        fast.cached = StoredResponse.loads(reply[1])
    elif reply[0] == 2:
        fast.locked = True
    else:
        fast.busy = True
    return fast


def finish(fast: FastPath, stored: StoredResponse | None, cache_ms: int) -> None:
    """Cache the finished response (if any) and release our lock; best effort."""
    client = get_redis()
    if client is None or not fast.available or not (fast.locked or stored):
        return
    payload = stored.dumps() if stored else ""
    # On a Redis error the lock expires by itself; the database holds the response.
    _, finish_script = _scripts(client)
    with contextlib.suppress(redis_lib.RedisError):
        finish_script(
            keys=[fast.lock_key, fast.response_key],
            args=[fast.token, payload, cache_ms],
        )
