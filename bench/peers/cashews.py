"""More peers that guard against the herd, without a copy in process memory: cashews (a lock, a soft
TTL, early refresh), aiocache's ``RedLock`` and django-redis's ``HerdClient``.

As in :mod:`bench.peers`: :data:`PEERS` for the parent, :func:`open_sync` and
:func:`open_async` for the workers (``None`` for a name that is not one of
these), third-party packages imported only there.
"""

from __future__ import annotations

import functools
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

from .._common.phase import Phase
from .base import (
    LOCK_TIMEOUT,
    SOCKET_TIMEOUT,
    STALE_TTL,
    AsyncPeer,
    AsyncRebuild,
    PeerSpec,
    SyncPeer,
    SyncRebuild,
    add_django_cache,
    plain_async_client,
)

__all__ = ["PEERS", "CashewsPeer", "open_async", "open_sync"]

_CASHEWS = (
    "`cashews.Cache().setup(url, suppress=False, socket_timeout=30, max_connections=20)`, one per "
    "process on its event loop (16 tasks); the rebuild is a coroutine function of the key, decorated "
    "once per expiry policy with `key='{key}'`"
)

#: The cashews peers of this module, and how each decorates its rebuild (:class:`CashewsPeer`).
_FLAVOURS = {"cashews-lock": "lock", "cashews-soft": "soft", "cashews-early": "early"}

PEERS: tuple[PeerSpec, ...] = (
    PeerSpec(
        name="cashews-lock",
        label="cashews `@cache(lock=True)`",
        short="cashews lock",
        modules=("cashews", "redis"),
        distributions=("cashews",),
        is_async=True,
        stale=False,
        config=(
            f"{_CASHEWS}: `@cache(ttl=ttl, key='{{key}}', lock=True)`. The lock (`SET NX PX ttl`) is taken "
            "around every call, hits too; a caller that finds it taken pings Redis and tries again at "
            "once (`check_interval=0`, the default); calls of one process for one key also share one "
            "task (`protected=True`, the default)."
        ),
    ),
    PeerSpec(
        name="cashews-soft",
        label="cashews `@cache.soft`",
        short="cashews soft",
        modules=("cashews", "redis"),
        distributions=("cashews",),
        is_async=True,
        stale=True,
        config=(
            f"{_CASHEWS}: `@cache.soft(ttl=ttl + {STALE_TTL}, soft_ttl=ttl, key='{{key}}')`: the value "
            "is kept past its soft TTL, but only served after it if the rebuild raises; no lock across "
            "processes (calls of one process share one task)."
        ),
    ),
    PeerSpec(
        name="cashews-early",
        label="cashews `@cache.early`",
        short="cashews early",
        modules=("cashews", "redis"),
        distributions=("cashews",),
        is_async=True,
        stale=True,
        config=(
            f"{_CASHEWS}: `@cache.early(ttl=ttl + {STALE_TTL}, early_ttl=ttl, key='{{key}}')`: past "
            "`early_ttl` the first caller to take a `SET NX` flag refreshes in a background task while "
            "every caller is served the old value; a missing key is rebuilt by every process that "
            "misses it (calls of one process share one task)."
        ),
    ),
    PeerSpec(
        name="aiocache",
        label="aiocache `RedisCache` + `RedLock`",
        short="aiocache RedLock",
        modules=("aiocache", "redis"),
        distributions=("aiocache",),
        is_async=True,
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
    ),
    PeerSpec(
        name="django-herd",
        label="django-redis `HerdClient`",
        short="django-redis herd",
        modules=("django", "django_redis", "redis"),
        distributions=("django-redis",),
        is_async=False,
        stale=True,
        config=(
            "`django_redis.cache.RedisCache` with `OPTIONS={'CLIENT_CLASS': "
            "'django_redis.client.HerdClient', 'SOCKET_TIMEOUT': 30}` and `CACHE_HERD_TIMEOUT = "
            f"{STALE_TTL}`: a value is stored for ttl + {STALE_TTL} s with its own expiry time beside "
            "it; past that, each `get` returns a miss with a probability that grows with the time "
            "since (whole seconds), and every caller that draws one rebuilds. A request is `get`, and on "
            "a miss rebuild and `set(key, value, ttl)`; `get_or_set` would store nothing on a refresh "
            "(its `add` is `SET NX`, and the old value is still there)."
        ),
    ),
)


# --- worker side ---------------------------------------------------------------


class CashewsPeer(AsyncPeer):
    """A cashews ``Cache`` of the peer's server; each expiry policy's rebuild is the coroutine
    function :func:`_compute`, decorated as ``flavour`` says: ``lock``, ``soft``, ``early``, or
    ``plain`` (``@cache(ttl=...)``)."""

    def __init__(self, url: str, flavour: str, *, pool_size: int, **backend: Any) -> None:
        from cashews import Cache

        self.client = plain_async_client(url)
        self.cache = Cache()
        self.cache.setup(
            url, suppress=False, socket_timeout=SOCKET_TIMEOUT, max_connections=pool_size, **backend
        )
        self.flavour = flavour
        self.functions: dict[tuple[int, int], Callable[..., Awaitable[Any]]] = {}

    def _decorated(self, phase: Phase) -> Callable[..., Awaitable[Any]]:
        policy = (phase.ttl, phase.stale_ttl)
        if policy not in self.functions:
            self.functions[policy] = self._decorator(*policy)(_compute)
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


async def _compute(key: str, rebuild: AsyncRebuild) -> Any:
    """What a cashews-decorated function of ``key`` computes: the caller's rebuild, which is no
    part of the cache key (``key='{key}'``)."""
    return await rebuild()


async def _aiocache_get(cache: Any, key: str, ttl: int, rebuild: AsyncRebuild) -> Any:
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


class _AioCache(AsyncPeer):
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
        return functools.partial(_aiocache_get, self.cache, phase.key, phase.ttl, rebuild)

    async def aclose(self) -> None:
        await self.cache.close()
        await self.client.aclose()


def _herd_get(cache: Any, key: str, ttl: int, rebuild: SyncRebuild) -> Any:
    value = cache.get(key)
    if value is not None:
        return value
    value = rebuild()
    cache.set(key, value, ttl)
    return value


class _DjangoHerd(SyncPeer):
    def __init__(self, url: str, prefix: str) -> None:
        add_django_cache(
            "herd",
            {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": url,
                "KEY_PREFIX": f"{prefix}herd",
                "OPTIONS": {
                    "CLIENT_CLASS": "django_redis.client.HerdClient",
                    "SOCKET_TIMEOUT": SOCKET_TIMEOUT,
                    "SOCKET_CONNECT_TIMEOUT": 10.0,
                },
            },
        )
        from django.conf import settings

        settings.CACHE_HERD_TIMEOUT = STALE_TTL  # read by each HerdClient when it is made

    def request(self, phase: Phase, rebuild: SyncRebuild) -> Callable[[], Any]:
        from django.core.cache import caches

        # Looked up in the calling thread: Django keeps one backend instance per thread.
        return functools.partial(_herd_get, caches["herd"], phase.key, phase.ttl, rebuild)

    def close(self) -> None:
        from django.core.cache import close_caches

        close_caches()


def open_sync(name: str, url: str, *, prefix: str, pool_size: int) -> SyncPeer | None:
    """The blocking peer ``name``, if it is one of this module's."""
    if name == "django-herd":
        return _DjangoHerd(url, prefix)
    return None


async def open_async(name: str, url: str, *, pool_size: int) -> AsyncPeer | None:
    """The asyncio peer ``name``, if it is one of this module's; on the loop it will run on."""
    if name in _FLAVOURS:
        peer = CashewsPeer(url, _FLAVOURS[name], pool_size=pool_size)
        await peer.cache.init()
        return peer
    if name == "aiocache":
        return _AioCache(url)
    return None
