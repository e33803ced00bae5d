"""The core's entry points in the many-waiters scenario: N threads or tasks of this process on one
cold key, through the public API only, on a client made by ``from_url(url)`` with redis-py's
defaults (among them a pool of at most 100 connections that raises when they are all in use).

Each runner takes the Redis URL, the namespace, N, the render log and the
per-caller timeout, and returns every caller's :class:`Outcome`; it closes
what it opened, on errors too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio

import stampede
import stampede.asyncio

from ._crowd import CallError, Outcome, in_tasks, in_threads
from ._renders import BODY, RenderLog

__all__ = ["KEY", "RUNNERS", "TTL", "Runner"]

#: The one cold key every caller asks for.
KEY = "many-waiters"
#: Seconds a value stays fresh: far longer than a run, so each run sees one cold key and no expiry.
TTL = 60

Runner = Callable[[str, str, int, RenderLog, float], list[Outcome]]


def _check(value: Any) -> None:
    if value != BODY:
        raise CallError(f"got {value!r} back, not what the render returned")


def _nothing() -> None:
    return None


def sync_read_commit(url: str, namespace: str, n: int, renders: RenderLog, timeout: float) -> list[Outcome]:
    """``read``, then the caller's own render and ``commit``, from N threads."""
    client = redis.Redis.from_url(url)
    sf = stampede.Stampede(client, namespace=namespace)

    def call(_: None) -> None:
        read = sf.read(KEY, ttl=TTL)
        if read.found:
            _check(read.value)
            return
        value = renders.render()
        if read.lease is not None:  # without one (it gave up waiting), nothing is to be stored
            sf.commit(read.lease, value)

    try:
        return in_threads(n, _nothing, call, timeout=timeout)
    finally:
        sf.close()
        client.close()


def sync_get_or_rebuild(
    url: str, namespace: str, n: int, renders: RenderLog, timeout: float
) -> list[Outcome]:
    """``get_or_rebuild`` from N threads."""
    client = redis.Redis.from_url(url)
    sf = stampede.Stampede(client, namespace=namespace)

    def call(_: None) -> None:
        _check(sf.get_or_rebuild(KEY, renders.render, ttl=TTL))

    try:
        return in_threads(n, _nothing, call, timeout=timeout)
    finally:
        sf.close()
        client.close()


async def _async_crowd(
    url: str, namespace: str, n: int, renders: RenderLog, timeout: float, *, lease: bool
) -> list[Outcome]:
    client = redis.asyncio.Redis.from_url(url)
    sf = stampede.asyncio.Stampede(client, namespace=namespace)

    async def get_or_rebuild() -> None:
        _check(await sf.get_or_rebuild(KEY, renders.arender, ttl=TTL))

    async def read_commit() -> None:
        read = await sf.read(KEY, ttl=TTL)
        if read.found:
            _check(read.value)
            return
        value = await renders.arender()
        if read.lease is not None:
            await sf.commit(read.lease, value)

    try:
        return await in_tasks(n, read_commit if lease else get_or_rebuild, timeout=timeout)
    finally:
        await sf.aclose()
        await client.aclose()


def async_get_or_rebuild(
    url: str, namespace: str, n: int, renders: RenderLog, timeout: float
) -> list[Outcome]:
    """``await get_or_rebuild`` with a coroutine render, from N tasks on a loop of its own."""
    return asyncio.run(_async_crowd(url, namespace, n, renders, timeout, lease=False))


def async_read_commit(url: str, namespace: str, n: int, renders: RenderLog, timeout: float) -> list[Outcome]:
    """``await read``, then the task's own render and ``await commit``, from N tasks."""
    return asyncio.run(_async_crowd(url, namespace, n, renders, timeout, lease=True))


#: The runner of each core entry point, by its name in :data:`bench.load.manywaiters.ENTRY_POINTS`.
RUNNERS: dict[str, Runner] = {
    "core-read": sync_read_commit,
    "core-get": sync_get_or_rebuild,
    "async-get": async_get_or_rebuild,
    "async-read": async_read_commit,
}
