"""The shared Redis client: short timeouts, because Redis is only ever a fast path.

`REDIS_URL` names a single Redis, or, with `REDIS_CLUSTER` set, one node of a Redis
Cluster: the client learns the others from it, follows `MOVED` and `ASK`, and after a
failed node reloads the cluster's map, so a promoted replica is found. A cluster
client retries a failed command twice, briefly (a failover takes seconds, longer than
a request should wait for its fast path); then, like a single node that is down, it
raises a `redis.RedisError` and the caller falls back (`IDEMPOTENCY_REDIS_FAILURE`).
"""

import threading
from functools import cache
from typing import Any

import redis
from django.conf import settings
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

TIMEOUTS: dict[str, Any] = {
    "socket_connect_timeout": 0.25,
    "socket_timeout": 0.25,
    "health_check_interval": 30,
}


class ClusterUnavailable(redis.ConnectionError):
    """No node of the Redis Cluster could serve a command (none reachable, or none
    serving the key's slot: a primary died and no replica has taken over yet)."""


class Cluster(RedisCluster):
    """A `RedisCluster` whose failures are all `redis.RedisError`s, as a single
    node's are: redis-py raises some of them (no reachable node, a slot no node
    serves) as `RedisClusterException`, which is not one."""

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().execute_command(*args, **kwargs)
        except RedisClusterException as exc:
            raise ClusterUnavailable(str(exc)) from exc


Client = redis.Redis | Cluster
# Threads of one worker that ask for the first time at once wait for one client
# (`cache` alone lets each build its own: pools and, on a cluster, its map lookup).
_connecting = threading.Lock()


@cache
def _client(url: str, cluster: bool) -> Client:
    if not cluster:
        return redis.Redis.from_url(url, retry_on_timeout=False, **TIMEOUTS)
    try:
        return Cluster(
            url=url,
            retry=Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.1), retries=2),
            **TIMEOUTS,
        )
    except RedisClusterException as exc:  # no node answered: try again next time
        raise ClusterUnavailable(str(exc)) from exc


def get_redis() -> Client | None:
    """One client (and connection pools) per process and URL; None without Redis.

    Raises `redis.RedisError` when a Redis Cluster is configured and no node of it
    can be reached to learn its map (a single node connects on first use instead).
    """
    url = settings.REDIS_URL
    if not url:
        return None
    with _connecting:
        return _client(url, settings.REDIS_CLUSTER)


def is_cluster() -> bool:
    return bool(settings.REDIS_URL and settings.REDIS_CLUSTER)


def redis_ping() -> bool:
    try:
        client = get_redis()
        return client is not None and bool(client.ping())
    except redis.RedisError:
        return False
