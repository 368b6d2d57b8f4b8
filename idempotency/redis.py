"""The shared Redis client: short timeouts, because Redis is only ever a fast path."""

from functools import cache

import redis
from django.conf import settings


@cache
def get_redis(url: str | None = None) -> redis.Redis | None:
    """One client (and connection pool) per process; None when Redis is not set up."""
    url = url if url is not None else settings.REDIS_URL
    if not url:
        return None
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=0.25,
        socket_timeout=0.25,
        retry_on_timeout=False,
        health_check_interval=30,
    )


def redis_ping() -> bool:
    client = get_redis()
    if client is None:
        return False
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
