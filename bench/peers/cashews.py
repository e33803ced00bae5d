"""cashews, as its documentation writes it: a lock, a soft TTL, early refresh and client-side
caching for the side-by-side run (:class:`CashewsPeer`), tags for the groups benchmark
(:class:`CashewsTagged`). Each benchmark decorates one coroutine function, :func:`compute`, whose
caller's rebuild is no part of the cache key."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .._common.phase import Phase
from .base import (
    SOCKET_TIMEOUT,
    STALE_TTL,
    AsyncPeer,
    AsyncRebuild,
    Opening,
    PeerSpec,
    Tagged,
    plain_async_client,
)

__all__ = ["HERD", "NEAR", "CashewsPeer", "CashewsTagged", "compute", "open_cache"]


def open_cache(url: str, *, connections: int, **backend: Any) -> Any:
    """A cashews ``Cache`` of ``url``, errors raised rather than swallowed (``suppress=False``)."""
    from cashews import Cache

    cache = Cache()
    cache.setup(url, suppress=False, socket_timeout=SOCKET_TIMEOUT, max_connections=connections, **backend)
    return cache


async def compute(key: str, rebuild: AsyncRebuild) -> Any:
    """What a cashews-decorated function of ``key`` computes: the caller's rebuild, which is no
    part of the cache key (the decorators are given ``key=`` templates of ``{key}`` alone)."""
    return await rebuild()


# --- the side-by-side run --------------------------------------------------------------------


class CashewsPeer(AsyncPeer):
    """A cashews ``Cache`` of the peer's server; each expiry policy's rebuild is :func:`compute`,
    decorated as ``flavour`` says: ``lock``, ``soft``, ``early``, or ``plain`` (``@cache(ttl=...)``)."""

    def __init__(self, url: str, flavour: str, *, pool_size: int, **backend: Any) -> None:
        self.client = plain_async_client(url)
        self.cache = open_cache(url, connections=pool_size, **backend)
        self.flavour = flavour
        self.functions: dict[tuple[int, int], Callable[..., Awaitable[Any]]] = {}

    def _decorated(self, phase: Phase) -> Callable[..., Awaitable[Any]]:
        policy = (phase.ttl, phase.stale_ttl)
        if policy not in self.functions:
            self.functions[policy] = self._decorator(*policy)(compute)
        return self.functions[policy]

    def _decorator(self, ttl: int, stale_ttl: int) -> Callable[[Any], Any]:
        decorator: Callable[[Any], Any]
        if self.flavour == "lock":
            decorator = self.cache(ttl=ttl, key="{key}", lock=True)
        elif self.flavour == "soft":
            decorator = self.cache.soft(ttl=ttl + stale_ttl, soft_ttl=ttl, key="{key}")
        elif self.flavour == "early":
            decorator = self.cache.early(ttl=ttl + stale_ttl, early_ttl=ttl, key="{key}")
        else:
            decorator = self.cache(ttl=ttl, key="{key}")
        return decorator

    def request(self, phase: Phase, rebuild: AsyncRebuild) -> Callable[[], Awaitable[Any]]:
        return functools.partial(self._decorated(phase), key=phase.key, rebuild=rebuild)

    async def write(self, phase: Phase, value: Any) -> None:
        # ``@cache`` stores the value itself under the key ('soft' and 'early' wrap it).
        if self.flavour not in ("plain", "lock"):
            raise NotImplementedError(f"cashews {self.flavour} wraps its values: no plain write")
        await self.cache.set(phase.key, value, expire=phase.ttl)

    async def aclose(self) -> None:
        await self.cache.close()
        await self.client.aclose()


def _opener(flavour: str, **backend: Any) -> Callable[[Opening], Awaitable[AsyncPeer]]:
    async def open_peer(at: Opening) -> AsyncPeer:
        peer = CashewsPeer(at.url, flavour, pool_size=at.pool_size, **backend)
        await peer.cache.init()
        return peer

    return open_peer


_CONFIG = (
    "`cashews.Cache().setup(url, suppress=False, socket_timeout=30, max_connections=20)`, one per "
    "process on its event loop (16 tasks); the rebuild is a coroutine function of the key, decorated "
    "once per expiry policy with `key='{key}'`"
)
_SHARED_TASK = "a call goes through cashews' decorators and a task of its own (`protected=True`)"

#: The herd's cashews peers: a lock, a soft TTL, early refresh.
HERD: tuple[PeerSpec, ...] = (
    PeerSpec(
        name="cashews-lock",
        label="cashews `@cache(lock=True)`",
        short="cashews lock",
        modules=("cashews", "redis"),
        distributions=("cashews",),
        stale=False,
        config=(
            f"{_CONFIG}: `@cache(ttl=ttl, key='{{key}}', lock=True)`. The lock (`SET NX PX ttl`) is taken "
            "around every call, hits too; a caller that finds it taken pings Redis and tries again at "
            "once (`check_interval=0`, the default); calls of one process for one key also share one "
            "task (`protected=True`, the default)."
        ),
        open_async=_opener("lock"),
        why={
            "expiry": "every call takes the key's lock, hits too, and a caller that finds it taken tries "
            "again at once: the callers of an expiry get their value one after another",
            "hit": "every call takes the key's lock (`SET NX`) and releases it (a script), hits too",
        },
    ),
    PeerSpec(
        name="cashews-soft",
        label="cashews `@cache.soft`",
        short="cashews soft",
        modules=("cashews", "redis"),
        distributions=("cashews",),
        stale=True,
        config=(
            f"{_CONFIG}: `@cache.soft(ttl=ttl + {STALE_TTL}, soft_ttl=ttl, key='{{key}}')`: the value "
            "is kept past its soft TTL, but only served after it if the rebuild raises; no lock across "
            "processes (calls of one process share one task)."
        ),
        open_async=_opener("soft"),
        why={
            "rebuilds": "no lock across processes: past the soft TTL each process rebuilds (its calls of "
            "one key share one task), and its callers wait for that",
            "hit": _SHARED_TASK,
        },
    ),
    PeerSpec(
        name="cashews-early",
        label="cashews `@cache.early`",
        short="cashews early",
        modules=("cashews", "redis"),
        distributions=("cashews",),
        stale=True,
        config=(
            f"{_CONFIG}: `@cache.early(ttl=ttl + {STALE_TTL}, early_ttl=ttl, key='{{key}}')`: past "
            "`early_ttl` the first caller to take a `SET NX` flag refreshes in a background task while "
            "every caller is served the old value; a missing key is rebuilt by every process that "
            "misses it (calls of one process share one task)."
        ),
        open_async=_opener("early"),
        why={
            "rebuilds": "a missing key is rebuilt by every process that misses it (its calls share one "
            "task); only a refresh past `early_ttl` is taken by one caller",
            "hit": _SHARED_TASK,
        },
    ),
)

#: cashews' client-side mode: a near cache that Redis invalidates.
NEAR = PeerSpec(
    name="cashews-near",
    label="cashews `@cache`, `client_side=True`",
    short="cashews client-side",
    modules=("cashews", "redis"),
    distributions=("cashews",),
    stale=False,
    config=(
        "`cashews.Cache().setup(url, client_side=True, protocol=2, suppress=False, socket_timeout=30, "
        "max_connections=20)` and `@cache(ttl=ttl, key='{key}')` (as cashews-lock, without the "
        "lock): values are kept in a `Memory(size=10000)` that a pub/sub connection in broadcast "
        "tracking mode (prefix `cashews:`) invalidates. `protocol=2` is needed with redis-py 8, "
        "whose default is RESP3: over RESP3 Redis sends the invalidations as push messages, which "
        "redis-py's pub/sub drops, and no copy is ever invalidated. Writes: `cache.set(key, value)`. "
        "Run in the hit and hot scenarios and in coherence."
    ),
    open_async=_opener("plain", client_side=True, protocol=2),
    scenarios=("hit", "hot"),
    coherence=True,
    why={"rebuilds": "no lock: each process rebuilds a missing key (its calls share one task)"},
)


# --- the groups benchmark ---------------------------------------------------------------------


class CashewsTagged(Tagged):
    """``@cache(ttl=..., key=key_template, tags=[...])`` (its default ``protected=True`` makes one
    process's calls of a key share one task), with ``lock=True`` its lock across processes too;
    a group is invalidated with ``delete_tags``, the only group invalidation cashews has."""

    def __init__(
        self, url: str, *, key_template: str, ttl: int, tags: Sequence[str], lock: bool, connections: int
    ) -> None:
        self.cache = open_cache(url, connections=connections)
        self.key_template = key_template
        # Registers each tag for the key template, as the decorator does for every tag it is given.
        decorate = self.cache(ttl=ttl, key=key_template, tags=list(tags), lock=lock)
        self.cached: Callable[..., Awaitable[Any]] = decorate(compute)

    async def read(self, key: str, rebuild: AsyncRebuild) -> Any:
        return await self.cached(key=key, rebuild=rebuild)

    async def invalidate(self, tag: str) -> None:
        await self.cache.delete_tags(tag)

    async def stored(self, keys: Sequence[str]) -> list[Any]:
        return list(await self.cache.get_many(*(self.key_template.format(key=key) for key in keys)))

    async def aclose(self) -> None:
        await self.cache.close()
