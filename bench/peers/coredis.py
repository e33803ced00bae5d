"""The other near caches: copies in process memory that Redis invalidates (``CLIENT TRACKING``):
cashews' client-side mode, redis-py's client-side cache and coredis's. stampede's own
(``near_cache=``) is in :mod:`bench.peers`, beside the other stampede peers.

None of these guards against the herd: they are measured on the hit path, on the hot key, and
in the coherence scenario (:mod:`bench.coherence`), where each peer's writes go through it too.
As in :mod:`bench.peers`: :data:`PEERS` for the parent, :func:`open_sync` and
:func:`open_async` for the workers (``None`` for a name that is not one of these).
"""

from __future__ import annotations

import asyncio
import functools
import pickle
from collections.abc import Awaitable, Callable
from typing import Any

import redis

from .._common.phase import Phase
from .base import (
    NEAR_ENTRIES,
    SOCKET_TIMEOUT,
    AsyncPeer,
    AsyncRebuild,
    PeerSpec,
    SyncPeer,
    SyncRebuild,
    naive_get,
    plain_async_client,
    warm_pool,
)
from .cashews import CashewsPeer

__all__ = ["PEERS", "open_async", "open_sync"]

_WHERE = "Run in the hit and hot scenarios and in coherence."

PEERS: tuple[PeerSpec, ...] = (
    PeerSpec(
        name="cashews-near",
        label="cashews `@cache`, `client_side=True`",
        short="cashews client-side",
        modules=("cashews", "redis"),
        distributions=("cashews",),
        is_async=True,
        stale=False,
        config=(
            "`cashews.Cache().setup(url, client_side=True, protocol=2, suppress=False, socket_timeout=30, "
            "max_connections=20)` and `@cache(ttl=ttl, key='{key}')` (as cashews-lock, without the "
            "lock): values are kept in a `Memory(size=10000)` that a pub/sub connection in broadcast "
            "tracking mode (prefix `cashews:`) invalidates. `protocol=2` is needed with redis-py 8, "
            "whose default is RESP3: over RESP3 Redis sends the invalidations as push messages, which "
            "redis-py's pub/sub drops, and no copy is ever invalidated. Writes: `cache.set(key, value)`. "
            f"{_WHERE}"
        ),
        scenarios=("hit", "hot"),
        coherence=True,
    ),
    PeerSpec(
        name="redis-py-cache",
        label="redis-py client-side cache",
        short="redis-py client-side cache",
        modules=("redis", "redis.cache"),
        distributions=("redis",),
        is_async=False,
        stale=False,
        config=(
            "naive cache-aside on `redis.Redis.from_url(url, protocol=3, cache_config=CacheConfig("
            f"max_size={NEAR_ENTRIES}))`, one per process: `GET` replies are kept by the client, each "
            "connection tracks the keys it read (default mode), and a connection reads the "
            "invalidations waiting for it before it serves a copy. redis-py refuses this with "
            "Valkey or a Redis older than 7.4. With the client shared by several threads (4 or more "
            "in a separate check), some requests around an expiry fail with `TimeoutError: Timeout "
            f"reading from socket`. Writes: `SET`. {_WHERE}"
        ),
        scenarios=("hit", "hot"),
        coherence=True,
        min_redis=(7, 4),
    ),
    PeerSpec(
        name="coredis-cache",
        label="coredis client-side cache",
        short="coredis client-side cache",
        modules=("coredis",),
        distributions=("coredis",),
        is_async=True,
        stale=False,
        config=(
            "naive cache-aside on `coredis.Redis.from_url(url, cache=LRUCache(max_keys="
            f"{NEAR_ENTRIES}), stream_timeout=30)` (`coredis.patterns.cache`), one per process, "
            "entered (`async with`) for the whole run: replies of read-only commands are kept, and "
            "one connection receives the invalidations (`CLIENT TRACKING ... REDIRECT`) in a "
            f"background task. Writes: `SET`. {_WHERE}"
        ),
        scenarios=("hit", "hot"),
        coherence=True,
    ),
)


# --- worker side ---------------------------------------------------------------


class _RedisPyCache(SyncPeer):
    def __init__(self, url: str, pool_size: int) -> None:
        from redis.cache import CacheConfig

        self.client = redis.Redis.from_url(
            url,
            protocol=3,
            cache_config=CacheConfig(max_size=NEAR_ENTRIES),
            socket_timeout=SOCKET_TIMEOUT,
            socket_connect_timeout=10.0,
        )
        warm_pool(self.client.connection_pool, pool_size)

    def request(self, phase: Phase, rebuild: SyncRebuild) -> Callable[[], Any]:
        return functools.partial(naive_get, self.client, phase.key, phase.ttl, rebuild)

    def write(self, phase: Phase, value: Any) -> None:
        self.client.set(phase.key, pickle.dumps(value, pickle.HIGHEST_PROTOCOL), ex=phase.ttl)

    def close(self) -> None:
        self.client.close()


async def _coredis_get(client: Any, key: str, ttl: int, rebuild: AsyncRebuild) -> Any:
    raw = await client.get(key)
    if raw is not None:
        return pickle.loads(raw)
    value = await rebuild()
    await client.set(key, pickle.dumps(value, pickle.HIGHEST_PROTOCOL), ex=ttl)
    return value


class _Coredis(AsyncPeer):
    def __init__(self, url: str, pool_size: int) -> None:
        import coredis
        from coredis.patterns.cache import LRUCache

        self.client = plain_async_client(url)
        self.coredis = coredis.Redis.from_url(
            url,
            cache=LRUCache(max_keys=NEAR_ENTRIES),
            stream_timeout=SOCKET_TIMEOUT,
            connect_timeout=10.0,
            max_connections=pool_size,
        )
        self._stop = asyncio.Event()
        self._held: asyncio.Task[None] | None = None

    async def open(self) -> None:
        # coredis 6 must be entered (`async with`), and its anyio task group left by the task that
        # entered it: the worker opens and closes its peers from different tasks, so one task of
        # our own holds it open.
        opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._held = asyncio.create_task(self._hold(opened))
        await opened

    async def _hold(self, opened: asyncio.Future[None]) -> None:
        try:
            async with self.coredis:
                opened.set_result(None)
                await self._stop.wait()
        except Exception as exc:
            if opened.done():
                raise
            opened.set_exception(exc)

    def request(self, phase: Phase, rebuild: AsyncRebuild) -> Callable[[], Awaitable[Any]]:
        return functools.partial(_coredis_get, self.coredis, phase.key, phase.ttl, rebuild)

    async def write(self, phase: Phase, value: Any) -> None:
        await self.coredis.set(phase.key, pickle.dumps(value, pickle.HIGHEST_PROTOCOL), ex=phase.ttl)

    async def aclose(self) -> None:
        self._stop.set()
        if self._held is not None:
            await self._held
        await self.client.aclose()


def open_sync(name: str, url: str, *, prefix: str, pool_size: int) -> SyncPeer | None:
    """The blocking peer ``name``, if it is one of this module's."""
    if name == "redis-py-cache":
        return _RedisPyCache(url, pool_size)
    return None


async def open_async(name: str, url: str, *, pool_size: int) -> AsyncPeer | None:
    """The asyncio peer ``name``, if it is one of this module's; on the loop it will run on."""
    if name == "cashews-near":
        cashews = CashewsPeer(url, "plain", pool_size=pool_size, client_side=True, protocol=2)
        await cashews.cache.init()
        return cashews
    if name == "coredis-cache":
        peer = _Coredis(url, pool_size)
        await peer.open()
        return peer
    return None
