"""coredis's client-side cache: replies of read-only commands kept by the client, invalidated over
one connection (``CLIENT TRACKING ... REDIRECT``) in a background task. Naive cache-aside runs on
it, asyncio."""

from __future__ import annotations

import asyncio
import functools
import pickle
from collections.abc import Awaitable, Callable
from typing import Any

from .._common.phase import Phase
from .base import (
    NEAR_ENTRIES,
    SOCKET_TIMEOUT,
    AsyncPeer,
    AsyncRebuild,
    Opening,
    PeerSpec,
    plain_async_client,
)

__all__ = ["PEER", "CoredisPeer"]


async def _naive_get(client: Any, key: str, ttl: int, rebuild: AsyncRebuild) -> Any:
    """:func:`bench.peers.naive.naive_get`, awaited."""
    raw = await client.get(key)
    if raw is not None:
        return pickle.loads(raw)
    value = await rebuild()
    await client.set(key, pickle.dumps(value, pickle.HIGHEST_PROTOCOL), ex=ttl)
    return value


class CoredisPeer(AsyncPeer):
    """A coredis client of the server with its cache (``coredis``), held open by :meth:`open` until
    :meth:`aclose`; ``client`` is the plain redis-py one every asyncio peer has."""

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
        return functools.partial(_naive_get, self.coredis, phase.key, phase.ttl, rebuild)

    async def write(self, phase: Phase, value: Any) -> None:
        await self.coredis.set(phase.key, pickle.dumps(value, pickle.HIGHEST_PROTOCOL), ex=phase.ttl)

    async def aclose(self) -> None:
        self._stop.set()
        if self._held is not None:
            await self._held
        await self.client.aclose()


async def _open(at: Opening) -> AsyncPeer:
    peer = CoredisPeer(at.url, at.pool_size)
    await peer.open()
    return peer


PEER = PeerSpec(
    name="coredis-cache",
    label="coredis client-side cache",
    short="coredis client-side cache",
    modules=("coredis",),
    distributions=("coredis",),
    stale=False,
    config=(
        "naive cache-aside on `coredis.Redis.from_url(url, cache=LRUCache(max_keys="
        f"{NEAR_ENTRIES}), stream_timeout=30)` (`coredis.patterns.cache`), one per process, "
        "entered (`async with`) for the whole run: replies of read-only commands are kept, and "
        "one connection receives the invalidations (`CLIENT TRACKING ... REDIRECT`) in a "
        "background task. Writes: `SET`. Run in the hit and hot scenarios and in coherence."
    ),
    open_async=_open,
    scenarios=("hit", "hot"),
    coherence=True,
    why={"rebuilds": "cache-aside: nothing coordinates the misses"},
)
