"""The benchmark server for django-idempotency-key (bench/contenders.py), set up as
its README says for several processes: responses in a Redis cache shared by every
worker, its Redis lock, and a replay answered with the stored status (not 409)."""

from bench.settings import *  # noqa: F403
from bench.settings import MIDDLEWARE, REDIS_URL

MIDDLEWARE = [*MIDDLEWARE, "idempotency_key.middleware.ExemptIdempotencyKeyMiddleware"]
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
    }
}
IDEMPOTENCY_KEY = {
    "STORAGE": {"CLASS": "idempotency_key.storage.CacheKeyStorage"},
    "LOCK": {
        "CLASS": "idempotency_key.locks.redis.MultiProcessRedisLock",
        "LOCATION": REDIS_URL,
    },
    "CONFLICT_STATUS_CODE": None,
}
