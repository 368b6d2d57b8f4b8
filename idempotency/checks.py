"""Settings that would quietly weaken a guarantee are refused before the app serves.

`manage.py migrate`, `check` and `runserver` run these checks (so `make run` stops on
them); a mistyped mode must not silently fall back to something else.
"""

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core import checks

MODES = ("required", "optional", "off")
REDIS_FAILURE = ("database", "refuse")
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


@checks.register()
def idempotency_settings(**kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []

    def refuse(setting: str, why: str, code: int) -> None:
        message = f"{setting} = {getattr(settings, setting)!r}: {why}"
        errors.append(checks.Error(message, id=f"idempotency.E{code:03}"))

    for setting in ("IDEMPOTENCY_TTL_SECONDS", "IDEMPOTENCY_LEASE_SECONDS"):
        if getattr(settings, setting) <= 0:
            refuse(setting, "must be a positive number of seconds", 1)
    if settings.IDEMPOTENCY_REPLAY_CACHE_SECONDS < 0:
        refuse("IDEMPOTENCY_REPLAY_CACHE_SECONDS", "must not be negative", 2)
    if settings.IDEMPOTENCY_REDIS_FAILURE not in REDIS_FAILURE:
        refuse("IDEMPOTENCY_REDIS_FAILURE", f"must be one of {REDIS_FAILURE}", 3)
    if any(mode not in MODES for mode in settings.IDEMPOTENCY_ENDPOINTS.values()):
        refuse("IDEMPOTENCY_ENDPOINTS", f"each mode must be one of {MODES}", 4)
    # redis-py reads the URL at the first command, and takes these schemes only
    # (spelled so): another would serve, and fail every key's lock with a 500.
    if settings.REDIS_URL and not settings.REDIS_URL.startswith(REDIS_SCHEMES):
        why = "names no Redis: use redis://HOST:6379/0 (or rediss://, unix://)"
        refuse("REDIS_URL", f"{why}, or leave it unset for none", 7)
    if settings.REDIS_CLUSTER:
        url = urlsplit(settings.REDIS_URL)  # a cluster has only database 0
        if url.scheme not in ("redis", "rediss") or url.path not in ("", "/", "/0"):
            why = "a Redis Cluster needs REDIS_URL=redis://<a node>:<port>/0"
            refuse("REDIS_URL", f"{why} (REDIS_CLUSTER is set)", 5)
    # A worker id lease is renewed every third of it, over a database round trip:
    # shorter than a second leaves no time for one.
    if settings.SNOWFLAKE_LEASE_SECONDS < 1:
        refuse("SNOWFLAKE_LEASE_SECONDS", "must be at least 1 second", 6)
    return errors
