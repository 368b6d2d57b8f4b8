"""The shared Redis client: short timeouts, because Redis is only ever a fast path."""

from functools import cache

import redis
from django.conf import settings


@cache
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=0.25,
        socket_timeout=0.25,
        retry_on_timeout=False,
        health_check_interval=30,
    )


def get_redis() -> redis.Redis | None:
    """One client (and connection pool) per process and URL; None without Redis."""
    url = settings.REDIS_URL
    return _client(url) if url else None


def redis_ping() -> bool:
    client = get_redis()
    if client is None:
        return False
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
