"""aiocache's ``RedisCache`` with its ``RedLock`` around a miss, as its documented example does."""

from __future__ import annotations

import functools
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

from .._common.phase import Phase
from .base import LOCK_TIMEOUT, SOCKET_TIMEOUT, AsyncPeer, AsyncRebuild, Opening, PeerSpec, plain_async_client

__all__ = ["PEER", "AioCachePeer"]


async def _locked_get(cache: Any, key: str, ttl: int, rebuild: AsyncRebuild) -> Any:
    from aiocache.lock import RedLock

    value = await cache.get(key)
    if value is not None:
        return value
    async with RedLock(cache, key, lease=LOCK_TIMEOUT):
        value = await cache.get(key)  # the holder before us may have stored it
        if value is not None:
            return value
        value = await rebuild()
        await cache.set(key, value, ttl=ttl)
        return value


class AioCachePeer(AsyncPeer):
    def __init__(self, url: str) -> None:
        import aiocache
        from aiocache.serializers import PickleSerializer

        parts = urllib.parse.urlsplit(url)
        self.client = plain_async_client(url)
        self.cache = aiocache.RedisCache(
            endpoint=parts.hostname or "127.0.0.1",
            port=parts.port or 6379,
            db=int(parts.path.lstrip("/") or 0),
            serializer=PickleSerializer(),
            timeout=SOCKET_TIMEOUT,
            create_connection_timeout=10.0,
            connection_pool_kwargs={"socket_timeout": SOCKET_TIMEOUT},
        )

    def request(self, phase: Phase, rebuild: AsyncRebuild) -> Callable[[], Awaitable[Any]]:
        return functools.partial(_locked_get, self.cache, phase.key, phase.ttl, rebuild)

    async def aclose(self) -> None:
        await self.cache.close()
        await self.client.aclose()


async def _open(at: Opening) -> AsyncPeer:
    return AioCachePeer(at.url)


PEER = PeerSpec(
    name="aiocache",
    label="aiocache `RedisCache` + `RedLock`",
    short="aiocache RedLock",
    modules=("aiocache", "redis"),
    distributions=("aiocache",),
    stale=False,
    config=(
        "`aiocache.RedisCache(endpoint, port, serializer=PickleSerializer(), timeout=30)`, one per "
        "process on its event loop (16 tasks); a request is `await cache.get(key)`, and on a miss "
        f"`async with RedLock(cache, key, lease={LOCK_TIMEOUT})`: `get` again, rebuild, `set(key, "
        "value, ttl=ttl)` (the documented example takes the lock before the first `get`; a hit "
        "needs no lock here). Only callers in the lock holder's process wait for it (on an "
        "`asyncio.Event` of that process, for at most the lease): in the other processes a caller "
        "that finds the lock taken goes ahead at once."
    ),
    open_async=_open,
    why={
        "rebuilds": "`RedLock` makes only the callers in the lock holder's process wait (on an "
        "`asyncio.Event`): callers in the other processes go ahead and rebuild"
    },
)
