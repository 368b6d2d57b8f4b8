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

On a Redis Cluster (`REDIS_CLUSTER`) every script run touches only keys it is given,
all in one hash slot: a key's lock, cached response and channel share the hash tag
`{<key digest>:<scope>}`. What a cluster cannot do in one script costs a second round
trip there: the middleware's begin first reads the caller's scope, then begins; a
finish that remembers the caller's credential (a key in another slot) writes it
separately. A single Redis keeps the one-trip scripts.
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
from django.db import DatabaseError, connection
from redis.commands.core import Script
from redis.exceptions import NoScriptError, RedisClusterException

from .redis import Client, get_redis, is_cluster
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

# KEYS: lock, response[, credential]. ARGV: token, response or '', cache ms, done
# channel[, scope, credential ms, revoked mark]. Only the holder deletes the lock: one
# whose lease ran out must not free a successor's. The lock goes first: a write that
# fails (Redis out of memory) stops the script, and must not leave the key locked for
# a whole lease. A cache time of 0 caches nothing. The credential entry, when given,
# lets `begin_for_credential` find this caller's scope; a revoked credential's mark is
# never overwritten (the request may have been authenticated before the revocation).
# Last, the finish is announced on the key's channel to anyone waiting (`Prefer:
# wait`); with no subscriber that costs nothing. Any holder's release announces, one
# whose request found the key in flight too: a waiter takes it as "look again" and
# checks the database (`waiting.until_finished`). (On a cluster the credential, in
# another hash slot, is left to `_REMEMBER`, and every node relays the announcement.)
_FINISH = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
if ARGV[2] ~= '' and tonumber(ARGV[3]) > 0 then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
if #KEYS == 3 and redis.call('GET', KEYS[3]) ~= ARGV[7] then
  redis.call('SET', KEYS[3], ARGV[5], 'PX', ARGV[6])
end
redis.call('PUBLISH', ARGV[4], '1')
return 1
"""

# KEYS: credential. ARGV: scope, credential ms, revoked mark. `_FINISH`'s credential
# entry, on its own: a Redis Cluster's second round trip of a finish.
_REMEMBER = """
if redis.call('GET', KEYS[1]) ~= ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 1
"""

# A single Redis: the scope read and `_BEGIN` in one round trip. KEYS: credential.
# ARGV: key digest, token, lease ms, revoked mark, the names' prefix. Returns {0}
# (unknown or revoked caller) or `_BEGIN`'s answer with the caller's scope appended:
# {1, cached, scope} | {2, scope} | {3, scope}. It names keys after the value it
# read (see `_names`), which a Redis Cluster refuses: there `begin_for_credential`
# makes two round trips.
_BEGIN_FOR_CREDENTIAL = """
local scope = redis.call('GET', KEYS[1])
if not scope or scope == ARGV[4] then return {0} end
local tag = ARGV[5] .. '{' .. ARGV[1] .. ':' .. scope .. '}:'
local cached = redis.call('GET', tag .. 'resp')
if cached then return {1, cached, scope} end
if redis.call('SET', tag .. 'lock', ARGV[2], 'NX', 'PX', ARGV[3]) then
  return {2, scope}
end
return {3, scope}
"""

# How long a credential → scope entry lives. Revoking a token replaces its entry at
# once (`credential_revoke`); this bounds only a revocation Redis did not hear of.
CREDENTIAL_MS = 60_000
# What a revoked credential's entry holds instead of a scope (no scope looks like it),
# and for how long: longer than any request the token sent before it was revoked.
REVOKED, REVOKED_MS = "revoked", 86_400_000


@cache
def _database_tag() -> str:
    """A short digest of which database this process keeps its keys in.

    What Redis holds speaks for that database only: a Redis that outlives it (the
    database dropped and created again, restored from a dump into a new one, or
    another deployment's pointed at the same Redis) must not replay its responses
    for effects the database in use never had. Every name below starts with this
    tag, so such entries are simply never found, and expire. The tag is when the
    database was migrated first (the oldest row of `django_migrations`, to the
    microsecond: new for every database made, the same for every process that
    serves one, whatever name or address it reaches it by) and, on PostgreSQL, the
    database's oid (new for a dump restored into a new database). A physical copy
    of a PostgreSQL cluster (a replica promoted, a point-in-time recovery) keeps
    both: after one, empty Redis (README "Idempotent writes"). Two plain reads,
    once per process.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT MIN(applied) FROM django_migrations")
        facts = [str(cursor.fetchone()[0])]
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT oid FROM pg_database WHERE datname = current_database()"
            )
            facts.append(str(cursor.fetchone()[0]))
    return hashlib.sha256("|".join(facts).encode()).hexdigest()[:12]


def _prefix() -> str:
    return f"idem:{_database_tag()}:"


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
    done_channel: str = ""
    scope: str = ""
    key: str = ""
    # The caller was found by its credential (`begin_for_credential`): Redis knows it.
    known_caller: bool = False

    def belongs_to(self, scope: str, key: str) -> bool:
        return self.available and (self.scope, self.key) == (scope, key)


@dataclass(frozen=True)
class _Scripts:
    begin: Script
    finish: Script
    remember: Script
    begin_for_credential: Script


@cache
def _scripts(client: Client) -> _Scripts:
    """The scripts, each run by `_run`."""
    return _Scripts(
        client.register_script(_BEGIN),
        client.register_script(_FINISH),
        client.register_script(_REMEMBER),
        client.register_script(_BEGIN_FOR_CREDENTIAL),
    )


def _run(client: Client, script: Script, keys: list[str], args: list[Any]) -> Any:
    """Run a script by its SHA (EVALSHA); a server that does not know it (restarted,
    flushed, failed over) is sent it once, then asked again.

    What `Script.__call__` does, without its check for a pipeline (none runs these),
    which costs a tenth of the call's CPU: this runs twice on every request.
    """
    try:
        return client.evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        script.sha = client.script_load(script.script)
        return client.evalsha(script.sha, len(keys), *keys, *args)


def _key_hash(key: str) -> str:
    # Keys may be 255 characters of anything printable: hash them into a fixed shape.
    return hashlib.sha256(key.encode()).hexdigest()[:40]


def _names(scope: str, key: str) -> tuple[str, str, str]:
    return _names_of(scope, _key_hash(key))


def _names_of(scope: str, key_hash: str) -> tuple[str, str, str]:
    """The key's lock, cached response and finish channel:
    `idem:<database>:{<digest>:<scope>}:` then `lock`, `resp`, `done`. The part in
    braces is the hash tag a Redis Cluster places them by, so one script may touch
    them together. It is never empty (the digest is hex; a brace in the scope only
    shortens it), and the same for the three, which share everything up to the
    closing brace."""
    tag = f"{_prefix()}{{{key_hash}:{scope}}}:"
    return f"{tag}lock", f"{tag}resp", f"{tag}done"


def _outcome(scope: str, key: str, key_hash: str, token: str, reply: Any) -> FastPath:
    """A begin script's answer, {1, cached} | {2} | {3}, for the key in `scope`."""
    lock_key, response_key, done_channel = _names_of(scope, key_hash)
    fast = FastPath(
        available=True,
        token=token,
        lock_key=lock_key,
        response_key=response_key,
        done_channel=done_channel,
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


def _credential_key(credential: str) -> str:
    return f"{_prefix()}cred:{credential}"


def begin(scope: str, key: str, lease_ms: int) -> FastPath:
    """Replay from the cache, or take the lock, or learn who holds it.

    Raises `redis.RedisError` when Redis is configured but unreachable; returns an
    unavailable FastPath when Redis is not configured at all.
    """
    client = get_redis()
    if client is None:
        return FastPath(available=False)
    return _begin(client, scope, key, lease_ms)


def _begin(client: Client, scope: str, key: str, lease_ms: int) -> FastPath:
    token, key_hash = secrets.token_hex(8), _key_hash(key)
    lock_key, response_key, _ = _names_of(scope, key_hash)
    script = _scripts(client).begin
    reply = _run(client, script, [lock_key, response_key], [token, lease_ms])
    return _outcome(scope, key, key_hash, token, reply)


def begin_for_credential(credential: str, key: str, lease_ms: int) -> FastPath | None:
    """`begin` for a caller known by the digest of its API token, before anyone has
    authenticated it: the token maps to the scope the engine last saw it use (see
    `finish`). None for a caller Redis does not know (or when Redis fails): the engine
    then makes its own `begin`.

    One round trip on a single Redis; two on a cluster, where the caller's scope is
    read first (a token revoked between the two is answered as if its request had
    come a moment earlier, as one the database authenticated just before would be).
    """
    if not credential:
        return None
    try:
        client = get_redis()
        if client is None:
            return None
        if is_cluster():
            scope: Any = client.get(_credential_key(credential))
            if scope is None or scope == REVOKED.encode():
                return None
            fast = _begin(client, scope.decode(), key, lease_ms)
            fast.known_caller = True
            return fast
        token, key_hash = secrets.token_hex(8), _key_hash(key)
        reply = _run(
            client,
            _scripts(client).begin_for_credential,
            [_credential_key(credential)],
            [key_hash, token, lease_ms, REVOKED, _prefix()],
        )
    except redis_lib.RedisError:
        return None
    except DatabaseError:  # (asked for `_database_tag`) the engine's path decides
        return None
    if reply[0] == 0:
        return None
    fast = _outcome(reply[-1].decode(), key, key_hash, token, reply)
    fast.known_caller = True
    return fast


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
    `begin_for_credential` knows the caller next time (on a cluster, in a second
    round trip: the credential's key lives in another hash slot). Not when it was
    `begin_for_credential` that found the caller: the entry is there, and lives out
    its `CREDENTIAL_MS` from when it was written (then one request of the caller's
    makes its own begin, and its finish writes the entry again).
    """
    if not fast.available or not (fast.locked or stored):
        return
    payload = stored.dumps() if stored else ""
    remember = bool(stored and credential and not fast.known_caller)
    fast.locked = False
    # On a Redis error the lock expires by itself; the database holds the response.
    with contextlib.suppress(redis_lib.RedisError):
        client = get_redis()
        if client is None:
            return
        scripts, cluster = _scripts(client), is_cluster()
        keys = [fast.lock_key, fast.response_key]
        args: list[Any] = [fast.token, payload, cache_ms, fast.done_channel]
        remembered: list[Any] = [scope, CREDENTIAL_MS, REVOKED]
        if remember and not cluster:
            keys, args = [*keys, _credential_key(credential)], [*args, *remembered]
        _run(client, scripts.finish, keys, args)
        if remember and cluster:
            _run(client, scripts.remember, [_credential_key(credential)], remembered)


def wait_for_finish(scope: str, key: str, seconds: float) -> bool:
    """Sleep until the request holding the key's Redis lock finishes (its `finish`
    publishes on the key's channel) or `seconds` pass; True if Redis did the waiting
    (which says nothing of the key: the holder may have been a duplicate).
    False when there is no Redis, it fails, or it holds no lock for the key (lost, or
    never taken): the caller then waits on the database."""
    if seconds <= 0:
        return False
    deadline = time.monotonic() + seconds
    lock_key, _, done = _names(scope, key)
    try:
        client = get_redis()
        if client is None:
            return False
        with client.pubsub(ignore_subscribe_messages=True) as pubsub:
            pubsub.subscribe(done)
            # Subscribed first, then looked: a finish in between is not missed.
            if not client.exists(lock_key):
                return False
            while (left := deadline - time.monotonic()) > 0:
                if pubsub.get_message(timeout=left) is not None:
                    break
    except (redis_lib.RedisError, RedisClusterException):
        return False
    return True


def credential_revoke(authorization: str) -> None:
    """Forget an `Authorization` value at once: the replay shortcut no longer knows
    it, and a request it sent before (still running) cannot teach it again.

    Best effort: with Redis unreachable, the entry it could not replace lives at most
    `CREDENTIAL_MS`.
    """
    credential = credential_digest(authorization)
    if not credential:
        return
    try:
        client = get_redis()
        if client is not None:
            client.set(_credential_key(credential), REVOKED, px=REVOKED_MS)
    except redis_lib.RedisError:
        logger.warning("could not revoke a credential in Redis", exc_info=True)


def release(fast: FastPath) -> None:
    """Give back a lock nobody used (best effort; it would expire by itself)."""
    if fast.locked:
        finish(fast, None, 0)
