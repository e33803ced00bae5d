"""The peers: what a user would pick instead of stampede, each used as its documentation suggests,
each wrapped once, in a module of its own, for every benchmark that runs it.

- :mod:`.naive`: naive cache-aside (and its batch on ``MGET``, the groups' floor).
- :mod:`.django`: Django's ``RedisCache.get_or_set``, django-redis's ``HerdClient``.
- :mod:`.dogpile`: dogpile.cache with a distributed lock (``get_or_create``, ``get_or_create_multi``).
- :mod:`.redis_lock`: redis-py's ``Lock`` around cache-aside.
- :mod:`.flask_caching`: Flask-Caching's ``memoize``.
- :mod:`.cashews`: cashews' lock, soft TTL, early refresh, client-side mode and tags.
- :mod:`.aiocache`: aiocache's ``RedLock``.
- :mod:`.redis_py_cache`, :mod:`.coredis`: redis-py's and coredis's client-side caches.
- :mod:`.stampede`: stampede itself, sync and asyncio, signed and with a near cache; tags, batches.

Each module's ``PeerSpec`` says how the side-by-side run (:mod:`bench.herd`) shows and opens the
peer; :data:`PEERS` is all of them in the order of its tables. What they share
(:class:`PeerSpec`, :class:`SyncPeer`, :class:`AsyncPeer`, the settings) is in :mod:`.base`.

Worker side: :func:`open_sync` and :func:`open_async` build a peer in a worker process. A peer's
``session(phase, rebuild)`` is a context manager around one caller's part of a phase; it yields
the callable that makes one request, as an application would write it. Third-party packages are
imported only there, so a peer that is not installed costs nothing until it is asked for.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from .._common.phase import Phase
from . import aiocache, cashews, coredis, django, dogpile, flask_caching, naive, redis_lock, redis_py_cache
from .base import (
    LOCK_TIMEOUT,
    SIGNING_KEY,
    STALE_TTL,
    WAIT_TIMEOUT,
    AsyncPeer,
    Opening,
    PeerSpec,
    SyncPeer,
    awarm_pool,
    warm_pool,
)
from .stampede import PEERS as STAMPEDE

__all__ = [
    "LOCK_TIMEOUT",
    "PEERS",
    "SIGNING_KEY",
    "STALE_TTL",
    "WAIT_TIMEOUT",
    "WHY",
    "AsyncPeer",
    "PeerSpec",
    "SyncPeer",
    "open_async",
    "open_sync",
    "spec",
    "warm_pool",
]

#: Every peer, in the order of the tables: the others, then stampede's.
PEERS: tuple[PeerSpec, ...] = (
    naive.PEER,
    django.PEER,
    dogpile.PEER,
    redis_lock.PEER,
    flask_caching.PEER,
    *cashews.HERD,
    aiocache.PEER,
    django.HERD,
    cashews.NEAR,
    redis_py_cache.PEER,
    coredis.PEER,
    *STAMPEDE,
)

#: Why a peer shows what :func:`bench.herd.summary.observations` finds, by peer and finding
#: (:attr:`PeerSpec.why`). Said only when the figures of the run show it.
WHY: dict[str, dict[str, str]] = {peer.name: dict(peer.why) for peer in PEERS if peer.why}


def spec(name: str) -> PeerSpec:
    for peer in PEERS:
        if peer.name == name:
            return peer
    raise KeyError(f"no peer named {name!r}")


def open_sync(
    name: str, url: str, *, prefix: str, phases: Sequence[Phase], client: redis.Redis, pool_size: int
) -> SyncPeer:
    """Build the blocking peer ``name`` in this process; ``client`` is the process's own client for
    ``url`` (warmed, shared by the peers that use a plain redis-py client)."""
    opener = spec(name).open_sync
    if opener is None:
        raise KeyError(f"no blocking peer named {name!r}")
    return opener(Opening(url, pool_size, prefix=prefix, phases=phases, client=client))


async def open_async(name: str, url: str, *, pool_size: int) -> AsyncPeer:
    """Build the asyncio peer ``name``; call it on the event loop it will run on."""
    opener = spec(name).open_async
    if opener is None:
        raise KeyError(f"no asyncio peer named {name!r}")
    peer = await opener(Opening(url, pool_size))
    await awarm_pool(peer.client.connection_pool, pool_size)
    return peer
