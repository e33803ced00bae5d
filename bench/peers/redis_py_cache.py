"""redis-py's client-side cache: ``GET`` replies kept by the client, each connection tracking the
keys it read (``CLIENT TRACKING``, default mode). Naive cache-aside runs on it. redis-py refuses it
with Valkey or a Redis older than 7.4."""

from __future__ import annotations

import redis

from .base import NEAR_ENTRIES, SOCKET_TIMEOUT, PeerSpec, warm_pool
from .naive import NaivePeer

__all__ = ["MIN_REDIS", "PEER", "RedisPyCachePeer", "cached_client"]

#: The oldest Redis server redis-py's client-side cache works with.
MIN_REDIS = (7, 4)


def cached_client(url: str, *, socket_timeout: float = SOCKET_TIMEOUT) -> redis.Redis:
    """A redis-py client of ``url`` with its client-side cache (RESP3), of :data:`NEAR_ENTRIES`."""
    from redis.cache import CacheConfig

    return redis.Redis.from_url(
        url,
        protocol=3,
        cache_config=CacheConfig(max_size=NEAR_ENTRIES),
        socket_timeout=socket_timeout,
        socket_connect_timeout=10.0,
    )


class RedisPyCachePeer(NaivePeer):
    """Naive cache-aside on a client of its own, with the client-side cache."""

    def __init__(self, url: str, pool_size: int) -> None:
        super().__init__(cached_client(url))
        warm_pool(self.client.connection_pool, pool_size)

    def close(self) -> None:
        self.client.close()


PEER = PeerSpec(
    name="redis-py-cache",
    label="redis-py client-side cache",
    short="redis-py client-side cache",
    modules=("redis", "redis.cache"),
    distributions=("redis",),
    stale=False,
    config=(
        "naive cache-aside on `redis.Redis.from_url(url, protocol=3, cache_config=CacheConfig("
        f"max_size={NEAR_ENTRIES}))`, one per process: `GET` replies are kept by the client, each "
        "connection tracks the keys it read (default mode), and a connection reads the "
        "invalidations waiting for it before it serves a copy. redis-py refuses this with "
        "Valkey or a Redis older than 7.4. With the client shared by several threads (4 or more "
        "in a separate check), some requests around an expiry fail with `TimeoutError: Timeout "
        "reading from socket`. Writes: `SET`. Run in the hit and hot scenarios and in coherence."
    ),
    open_sync=lambda at: RedisPyCachePeer(at.url, at.pool_size),
    scenarios=("hit", "hot"),
    coherence=True,
    min_redis=MIN_REDIS,
    why={"rebuilds": "cache-aside: nothing coordinates the misses"},
)
