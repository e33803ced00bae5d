"""dogpile.cache on its ``dogpile.cache.redis`` backend with ``distributed_lock=True``, configured
as its documentation advises: ``get_or_create`` for the side-by-side run, ``get_or_create_multi``
for the groups benchmark's batches."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import redis

from .._common.phase import Phase
from .base import (
    LOCK_TIMEOUT,
    SOCKET_TIMEOUT,
    STALE_TTL,
    Batch,
    BatchRebuild,
    PeerSpec,
    SyncPeer,
    SyncRebuild,
    warm_pool,
)

__all__ = ["PEER", "DogpileBatch", "DogpilePeer", "pool", "region"]


def pool(url: str) -> redis.ConnectionPool:
    """The connection pool every region of a process shares."""
    return redis.ConnectionPool.from_url(url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=10.0)


def region(connections: redis.ConnectionPool, ttl: int, stale_ttl: int) -> Any:
    """A region (dogpile's unit of expiry policy) whose values are fresh for ``ttl`` seconds and
    kept by Redis ``stale_ttl`` seconds longer, so that while one caller holds the Redis lock and
    regenerates, the others are served the expired value (``thread_local_lock=False``, as its
    docs ask of a distributed lock)."""
    from dogpile.cache import make_region

    return make_region().configure(
        "dogpile.cache.redis",
        expiration_time=ttl,
        arguments={
            "connection_pool": connections,
            "redis_expiration_time": ttl + stale_ttl,
            "distributed_lock": True,
            "thread_local_lock": False,
            "lock_timeout": LOCK_TIMEOUT,
        },
    )


class DogpilePeer(SyncPeer):
    def __init__(self, url: str, phases: Sequence[Phase], pool_size: int) -> None:
        self.pool = pool(url)
        warm_pool(self.pool, pool_size)
        # One region per (ttl, stale_ttl) the phases use, all on the process's one pool.
        self.regions: dict[tuple[int, int], Any] = {}
        for phase in phases:
            policy = (phase.ttl, phase.stale_ttl)
            if policy not in self.regions:
                self.regions[policy] = region(self.pool, *policy)

    def request(self, phase: Phase, rebuild: SyncRebuild) -> Callable[[], Any]:
        chosen = self.regions[(phase.ttl, phase.stale_ttl)]
        return functools.partial(chosen.get_or_create, phase.key, rebuild)

    def close(self) -> None:
        self.pool.disconnect()


PEER = PeerSpec(
    name="dogpile",
    label="dogpile.cache `get_or_create`, `distributed_lock=True`",
    short="dogpile.cache",
    modules=("dogpile.cache", "redis"),
    distributions=("dogpile.cache",),
    stale=True,
    config=(
        "`make_region().configure('dogpile.cache.redis', expiration_time=ttl, arguments="
        f"{{'redis_expiration_time': ttl + {STALE_TTL}, 'distributed_lock': True, "
        f"'thread_local_lock': False, 'lock_timeout': {LOCK_TIMEOUT}, 'connection_pool': pool}})`, "
        "one region per expiry policy, all sharing one pool per process; a request is "
        "`region.get_or_create(key, rebuild)`. As its docs advise, Redis keeps a value "
        f"{STALE_TTL} s longer than dogpile considers it fresh, so that while one caller holds the "
        "Redis lock and regenerates, the others are served the expired value; a caller that finds "
        "no value at all blocks on the lock, which polls every `lock_sleep` (0.1 s, the default)."
    ),
    open_sync=lambda at: DogpilePeer(at.url, at.phases, at.pool_size),
    why={
        "rebuilds": "after taking the lock, dogpile re-reads the value only if it had none: a caller "
        "that read the stale value just before the refresh landed can take the freed lock and "
        "regenerate again",
        "waiters": "callers that found no value take the Redis lock one after another to re-read it, "
        "each retrying every 0.1 s",
    },
)


class DogpileBatch(Batch):
    """``region.get_or_create_multi``: the missing keys' locks taken one after another."""

    def __init__(self, url: str, *, ttl: int, stale_ttl: int) -> None:
        self.pool = pool(url)
        self.region = region(self.pool, ttl, stale_ttl)

    def get_many(self, keys: list[str], rebuild_many: BatchRebuild) -> dict[str, Any]:
        def creator(*asked: str) -> list[Any]:
            built = rebuild_many(list(asked))
            return [built[key] for key in asked]

        return dict(zip(keys, self.region.get_or_create_multi(keys, creator), strict=True))

    def close(self) -> None:
        self.pool.disconnect()
