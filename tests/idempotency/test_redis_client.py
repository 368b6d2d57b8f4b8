"""One Redis client per process, however many threads ask for it first at once."""

import time

import redis

from idempotency import redis as shared
from tests.conftest import run_in_threads


def test_threads_asking_at_once_share_one_client(settings, monkeypatch):
    """gthread workers: requests in several threads make the worker's first Redis
    call together; all get the one client (one set of pools)."""
    settings.REDIS_URL = "redis://127.0.0.1:6379/15"
    settings.REDIS_CLUSTER = False
    connect = redis.Redis.from_url

    def slow_connect(*args, **kwargs):
        time.sleep(0.05)  # (building a cluster client asks a node for its map)
        return connect(*args, **kwargs)

    monkeypatch.setattr(redis.Redis, "from_url", slow_connect)
    shared._client.cache_clear()
    try:
        clients = run_in_threads(8, lambda i: shared.get_redis())
    finally:
        shared._client.cache_clear()
    assert len({id(client) for client in clients}) == 1
