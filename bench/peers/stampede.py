"""stampede itself, as the benchmarks beside its peers drive it: the sync and asyncio drivers for
the side-by-side run, each also signed (``signing_key=``) and with a near cache (``near_cache=``);
tagged reads and group invalidation (asyncio) and batches (sync) for the groups benchmark."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

import stampede
import stampede.asyncio

from .._common.phase import Phase
from .._common.workload import NAMESPACE
from .base import (
    LOCK_TIMEOUT,
    NEAR_ENTRIES,
    SIGNING_KEY,
    SOCKET_TIMEOUT,
    STALE_TTL,
    WAIT_TIMEOUT,
    AsyncPeer,
    AsyncRebuild,
    Batch,
    BatchRebuild,
    Opening,
    PeerSpec,
    SyncPeer,
    SyncRebuild,
    Tagged,
    plain_async_client,
)

__all__ = [
    "PEERS",
    "StampedeAsyncioPeer",
    "StampedeBatch",
    "StampedeOptions",
    "StampedePeer",
    "StampedeTagged",
]


# --- the side-by-side run --------------------------------------------------------------------


def _options(phase: Phase) -> dict[str, Any]:
    """The per-call options of ``get_or_rebuild``, as a user would pass them: only those that
    differ from the defaults."""
    options: dict[str, Any] = {"ttl": phase.ttl, "stale_ttl": phase.stale_ttl}
    if phase.background:
        options["background"] = True
    return options


class StampedePeer(SyncPeer):
    def __init__(
        self, client: redis.Redis, *, signing_key: bytes | None = None, near_cache: int | None = None
    ) -> None:
        self.sf = stampede.Stampede(
            client, namespace=NAMESPACE, signing_key=signing_key, near_cache=near_cache
        )

    def request(self, phase: Phase, rebuild: SyncRebuild) -> Callable[[], Any]:
        return functools.partial(self.sf.get_or_rebuild, phase.key, rebuild, **_options(phase))

    def write(self, phase: Phase, value: Any) -> None:
        self.sf.set(phase.key, value, ttl=phase.ttl, stale_ttl=phase.stale_ttl)

    def drain(self) -> None:
        self.sf.close()  # waits for background refreshes: they add to the records

    def close(self) -> None:
        self.sf.close()


class StampedeAsyncioPeer(AsyncPeer):
    def __init__(self, url: str, *, signing_key: bytes | None = None, near_cache: int | None = None) -> None:
        self.client = plain_async_client(url)
        self.sf = stampede.asyncio.Stampede(
            self.client, namespace=NAMESPACE, signing_key=signing_key, near_cache=near_cache
        )

    def request(self, phase: Phase, rebuild: AsyncRebuild) -> Callable[[], Awaitable[Any]]:
        return functools.partial(self.sf.get_or_rebuild, phase.key, rebuild, **_options(phase))

    async def write(self, phase: Phase, value: Any) -> None:
        await self.sf.set(phase.key, value, ttl=phase.ttl, stale_ttl=phase.stale_ttl)

    async def drain(self) -> None:
        await self.sf.aclose()

    async def aclose(self) -> None:
        await self.sf.aclose()
        await self.client.aclose()


def _asyncio_opener(**options: Any) -> Callable[[Opening], Awaitable[AsyncPeer]]:
    async def open_peer(at: Opening) -> AsyncPeer:
        return StampedeAsyncioPeer(at.url, **options)

    return open_peer


@functools.cache
def _asyncio_near_cache() -> str | None:
    """Why ``stampede.asyncio.Stampede(client, near_cache=...)`` cannot run here, if it cannot: the
    constructor is asked (no connection is made)."""
    import asyncio

    import redis.asyncio

    async def construct() -> None:
        client = redis.asyncio.Redis()
        try:
            sf = stampede.asyncio.Stampede(client, namespace=NAMESPACE, near_cache=NEAR_ENTRIES)
            with contextlib.suppress(redis.RedisError, OSError):
                await sf.aclose()
        finally:
            await client.aclose()

    try:
        asyncio.run(construct())
    except stampede.ConfigurationError as exc:
        return f"this stampede.asyncio refuses `near_cache=` ({exc})"
    return None


#: stampede's rows of the side-by-side run, after every other peer's.
PEERS: tuple[PeerSpec, ...] = (
    PeerSpec(
        name="stampede",
        label="stampede `get_or_rebuild` (sync)",
        short="stampede",
        modules=("stampede", "redis"),
        distributions=("redis-stampede",),
        stale=True,
        config=(
            "`stampede.Stampede(redis.Redis(...))`, one per process, shared by its threads; a request is "
            f"`sf.get_or_rebuild(key, rebuild, ttl=ttl, stale_ttl={STALE_TTL})`, the other options at "
            f"their defaults (`lease_ttl={LOCK_TIMEOUT}`, `wait_timeout={WAIT_TIMEOUT}`). The background "
            "row adds `background=True`."
        ),
        open_sync=lambda at: StampedePeer(at.plain_client()),
        coherence=True,
    ),
    PeerSpec(
        name="stampede-signed",
        label="stampede `get_or_rebuild`, `signing_key=` (sync)",
        short="stampede signed",
        modules=("stampede", "redis"),
        distributions=("redis-stampede",),
        stale=True,
        config=(
            "as stampede (sync), with `stampede.Stampede(redis.Redis(...), signing_key=key)`, `key` a fixed "
            f"{len(SIGNING_KEY)}-byte string: every value is stored with an HMAC-SHA256 tag and verified "
            "on every read. Run in the hit scenario only (cold and hot would repeat stampede's rows)."
        ),
        open_sync=lambda at: StampedePeer(at.plain_client(), signing_key=SIGNING_KEY),
        scenarios=("hit",),
    ),
    PeerSpec(
        name="stampede-near",
        label="stampede `get_or_rebuild`, `near_cache=` (sync)",
        short="stampede near cache",
        modules=("stampede", "redis"),
        distributions=("redis-stampede",),
        stale=True,
        config=(
            f"as stampede (sync), with `stampede.Stampede(redis.Redis(...), near_cache={NEAR_ENTRIES})`: "
            "each process keeps the stored bytes of the values it read, kept coherent by `CLIENT "
            "TRACKING` (broadcast on the namespace's prefix) on its subscriber connection. Run in the "
            "hit and hot scenarios and in coherence."
        ),
        open_sync=lambda at: StampedePeer(at.plain_client(), near_cache=NEAR_ENTRIES),
        scenarios=("hit", "hot"),
        coherence=True,
    ),
    PeerSpec(
        name="stampede-asyncio",
        label="stampede.asyncio `get_or_rebuild`",
        short="stampede asyncio",
        modules=("stampede", "redis"),
        distributions=("redis-stampede",),
        stale=True,
        config=(
            "`stampede.asyncio.Stampede(redis.asyncio.Redis(...))`, one per process on its event loop, "
            "with 16 tasks per process in place of threads; a request is `await sf.get_or_rebuild(key, "
            f"rebuild, ttl=ttl, stale_ttl={STALE_TTL})` with a coroutine rebuild (`await incr`, "
            "`await asyncio.sleep`)."
        ),
        open_async=_asyncio_opener(),
    ),
    PeerSpec(
        name="stampede-asyncio-signed",
        label="stampede.asyncio `get_or_rebuild`, `signing_key=`",
        short="stampede asyncio signed",
        modules=("stampede", "redis"),
        distributions=("redis-stampede",),
        stale=True,
        config=(
            "as stampede.asyncio, with `stampede.asyncio.Stampede(redis.asyncio.Redis(...), "
            f"signing_key=key)`, the same {len(SIGNING_KEY)}-byte key as the sync signed peer. Run in the "
            "hit scenario only."
        ),
        open_async=_asyncio_opener(signing_key=SIGNING_KEY),
        scenarios=("hit",),
    ),
    PeerSpec(
        name="stampede-asyncio-near",
        label="stampede.asyncio `get_or_rebuild`, `near_cache=`",
        short="stampede asyncio near cache",
        modules=("stampede", "redis"),
        distributions=("redis-stampede",),
        stale=True,
        config=(
            "as stampede.asyncio, with `stampede.asyncio.Stampede(redis.asyncio.Redis(...), "
            f"near_cache={NEAR_ENTRIES})`. Run in the hit and hot scenarios and in coherence."
        ),
        open_async=_asyncio_opener(near_cache=NEAR_ENTRIES),
        scenarios=("hit", "hot"),
        coherence=True,
        check=_asyncio_near_cache,
    ),
)


# --- the groups benchmark ---------------------------------------------------------------------


@dataclass(frozen=True)
class StampedeOptions:
    """How the groups benchmark runs stampede: the instance's namespace and ``tag_check_interval``
    (how long a tag's state read is trusted), and each call's ``ttl``, ``stale_ttl`` and tags."""

    namespace: str
    tag_check_interval: float
    ttl: int
    stale_ttl: int
    tags: tuple[str, ...]

    def calls(self) -> dict[str, Any]:
        """The options of each ``get_or_rebuild`` or ``get_or_rebuild_many``."""
        return {"ttl": self.ttl, "stale_ttl": self.stale_ttl, "tags": self.tags}


class StampedeTagged(Tagged):
    """``stampede.asyncio.Stampede``'s ``get_or_rebuild(..., tags=...)``; a group invalidated soft
    (``invalidate_tags``: stale, served while one caller refreshes) or ``hard`` (``delete_tags``)."""

    def __init__(
        self,
        url: str,
        options: StampedeOptions,
        *,
        hard: bool,
        background: bool = False,
        on_event: stampede.EventHook | None = None,
    ) -> None:
        self.client = plain_async_client(url)
        self.sf = stampede.asyncio.Stampede(
            self.client,
            namespace=options.namespace,
            tag_check_interval=options.tag_check_interval,
            on_event=on_event,
        )
        self.hard = hard
        self.options = options.calls()
        if background:
            self.options["background"] = True

    async def read(self, key: str, rebuild: AsyncRebuild) -> Any:
        return await self.sf.get_or_rebuild(key, rebuild, **self.options)

    async def invalidate(self, tag: str) -> None:
        if self.hard:
            await self.sf.delete_tags(tag)
        else:
            await self.sf.invalidate_tags(tag)

    async def stored(self, keys: Sequence[str]) -> list[Any]:
        found = await self.sf.get_many(keys)
        return [found.get(key) for key in keys]

    async def aclose(self) -> None:
        await self.sf.aclose()  # waits for background refreshes
        await self.client.aclose()


class StampedeBatch(Batch):
    """``Stampede.get_or_rebuild_many``, blocking."""

    def __init__(self, url: str, options: StampedeOptions) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=10.0)
        self.sf = stampede.Stampede(
            self.client, namespace=options.namespace, tag_check_interval=options.tag_check_interval
        )
        self.options = options.calls()

    def get_many(self, keys: list[str], rebuild_many: BatchRebuild) -> dict[str, Any]:
        return self.sf.get_or_rebuild_many(keys, rebuild_many, **self.options)

    def close(self) -> None:
        self.sf.close()
        self.client.close()
