"""The peers: what a user would pick instead of stampede, each used as its documentation suggests.

Parent side: :data:`PEERS`, one :class:`PeerSpec` per peer (its name for
``--peer``, its labels, the packages it needs, how it is configured): those
defined here, and those of :mod:`bench.herdpeers` and :mod:`bench.nearpeers`.
What they share (:class:`PeerSpec`, :class:`SyncPeer`, :class:`AsyncPeer`) is
in :mod:`bench._peerbase`, re-exported here.

Worker side: :func:`open_sync` and :func:`open_async` build a peer in a worker
process. A peer's ``session(phase, rebuild)`` is a context manager around one
caller's part of a phase; it yields the callable that makes one request, as
an application would write it. Third-party packages are imported only there,
so a peer that is not installed costs nothing until it is asked for.
"""

from __future__ import annotations

import contextlib
import functools
import pickle
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, cast

import redis

from .._common.phase import Phase
from .._common.workload import NAMESPACE
from . import cashews as herdpeers
from . import coredis as nearpeers
from .base import (
    LOCK_TIMEOUT,
    NEAR_ENTRIES,
    SIGNING_KEY,
    SOCKET_TIMEOUT,
    STALE_TTL,
    WAIT_TIMEOUT,
    AsyncPeer,
    AsyncRebuild,
    PeerSpec,
    SyncPeer,
    SyncRebuild,
    add_django_cache,
    naive_get,
    plain_async_client,
    warm_pool,
)

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


_OTHERS: tuple[PeerSpec, ...] = (
    PeerSpec(
        name="naive",
        label="naive cache-aside",
        short="naive cache-aside",
        modules=("redis",),
        distributions=("redis",),
        is_async=False,
        stale=False,
        config=(
            "`GET`; on a miss rebuild, then `SET key value EX ttl`; values pickled. One redis-py client "
            "per process, its pool shared by the 16 threads."
        ),
        coherence=True,
    ),
    PeerSpec(
        name="django",
        label="Django `RedisCache.get_or_set`",
        short="Django get_or_set",
        modules=("django", "redis"),
        distributions=("Django",),
        is_async=False,
        stale=False,
        config=(
            "`django.core.cache.backends.redis.RedisCache` with `LOCATION` the server's URL, `KEY_PREFIX` "
            "the run's prefix, `OPTIONS={'socket_timeout': 30}`, set with `settings.configure()` and "
            "`django.setup()` in each worker; a request is `caches['default'].get_or_set(key, rebuild, "
            "timeout=ttl)` (Django gives each thread its own backend instance, so its own pool). On a "
            "miss Django runs the rebuild, then `add` (`SET NX EX`) and `GET` again."
        ),
    ),
    PeerSpec(
        name="dogpile",
        label="dogpile.cache `get_or_create`, `distributed_lock=True`",
        short="dogpile.cache",
        modules=("dogpile.cache", "redis"),
        distributions=("dogpile.cache",),
        is_async=False,
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
    ),
    PeerSpec(
        name="redis-lock",
        label="redis-py `Lock` around cache-aside",
        short="redis-py Lock",
        modules=("redis",),
        distributions=("redis",),
        is_async=False,
        stale=False,
        config=(
            f"`GET`; on a miss `client.lock(key + ':lock', timeout={LOCK_TIMEOUT}, "
            f"blocking_timeout={WAIT_TIMEOUT})` (redis-py's `Lock`: a token under `SET NX PX`, retried "
            "every 0.1 s, its default `sleep`), `GET` again, rebuild, `SET EX ttl`, release (a Lua "
            "script). A caller that gives up waiting rebuilds for itself without storing. One client per "
            "process, as for naive."
        ),
    ),
    PeerSpec(
        name="flask-caching",
        label="Flask-Caching `@cache.memoize`",
        short="Flask-Caching memoize",
        modules=("flask", "flask_caching", "redis"),
        distributions=("Flask-Caching",),
        is_async=False,
        stale=False,
        config=(
            "`flask_caching.Cache(app, config={'CACHE_TYPE': 'RedisCache', 'CACHE_REDIS_URL': url, "
            "'CACHE_KEY_PREFIX': prefix, 'CACHE_OPTIONS': {'socket_timeout': 30}})`; the rebuild is a "
            "function of the key decorated with `@cache.memoize(timeout=ttl)`, called inside an app "
            "context (one per thread). A memoized call reads the function's version key (`MGET`) and "
            "then the value (`GET`); a miss stores the value, then the version again with the same "
            "timeout."
        ),
    ),
)


@functools.cache
def _asyncio_near_cache() -> str | None:
    """Why ``stampede.asyncio.Stampede(client, near_cache=...)`` cannot run here, if it cannot: the
    constructor is asked (no connection is made)."""
    import asyncio

    import redis.asyncio

    import stampede
    import stampede.asyncio

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


_STAMPEDE: tuple[PeerSpec, ...] = (
    PeerSpec(
        name="stampede",
        label="stampede `get_or_rebuild` (sync)",
        short="stampede",
        modules=("stampede", "redis"),
        distributions=("redis-stampede",),
        is_async=False,
        stale=True,
        config=(
            "`stampede.Stampede(redis.Redis(...))`, one per process, shared by its threads; a request is "
            f"`sf.get_or_rebuild(key, rebuild, ttl=ttl, stale_ttl={STALE_TTL})`, the other options at "
            f"their defaults (`lease_ttl={LOCK_TIMEOUT}`, `wait_timeout={WAIT_TIMEOUT}`). The background "
            "row adds `background=True`."
        ),
        coherence=True,
    ),
    PeerSpec(
        name="stampede-signed",
        label="stampede `get_or_rebuild`, `signing_key=` (sync)",
        short="stampede signed",
        modules=("stampede", "redis"),
        distributions=("redis-stampede",),
        is_async=False,
        stale=True,
        config=(
            "as stampede (sync), with `stampede.Stampede(redis.Redis(...), signing_key=key)`, `key` a fixed "
            f"{len(SIGNING_KEY)}-byte string: every value is stored with an HMAC-SHA256 tag and verified "
            "on every read. Run in the hit scenario only (cold and hot would repeat stampede's rows)."
        ),
        scenarios=("hit",),
    ),
    PeerSpec(
        name="stampede-near",
        label="stampede `get_or_rebuild`, `near_cache=` (sync)",
        short="stampede near cache",
        modules=("stampede", "redis"),
        distributions=("redis-stampede",),
        is_async=False,
        stale=True,
        config=(
            f"as stampede (sync), with `stampede.Stampede(redis.Redis(...), near_cache={NEAR_ENTRIES})`: "
            "each process keeps the stored bytes of the values it read, kept coherent by `CLIENT "
            "TRACKING` (broadcast on the namespace's prefix) on its subscriber connection. Run in the "
            "hit and hot scenarios and in coherence."
        ),
        scenarios=("hit", "hot"),
        coherence=True,
    ),
    PeerSpec(
        name="stampede-asyncio",
        label="stampede.asyncio `get_or_rebuild`",
        short="stampede asyncio",
        modules=("stampede", "redis"),
        distributions=("redis-stampede",),
        is_async=True,
        stale=True,
        config=(
            "`stampede.asyncio.Stampede(redis.asyncio.Redis(...))`, one per process on its event loop, "
            "with 16 tasks per process in place of threads; a request is `await sf.get_or_rebuild(key, "
            f"rebuild, ttl=ttl, stale_ttl={STALE_TTL})` with a coroutine rebuild (`await incr`, "
            "`await asyncio.sleep`)."
        ),
    ),
    PeerSpec(
        name="stampede-asyncio-signed",
        label="stampede.asyncio `get_or_rebuild`, `signing_key=`",
        short="stampede asyncio signed",
        modules=("stampede", "redis"),
        distributions=("redis-stampede",),
        is_async=True,
        stale=True,
        config=(
            "as stampede.asyncio, with `stampede.asyncio.Stampede(redis.asyncio.Redis(...), "
            f"signing_key=key)`, the same {len(SIGNING_KEY)}-byte key as the sync signed peer. Run in the "
            "hit scenario only."
        ),
        scenarios=("hit",),
    ),
    PeerSpec(
        name="stampede-asyncio-near",
        label="stampede.asyncio `get_or_rebuild`, `near_cache=`",
        short="stampede asyncio near cache",
        modules=("stampede", "redis"),
        distributions=("redis-stampede",),
        is_async=True,
        stale=True,
        config=(
            "as stampede.asyncio, with `stampede.asyncio.Stampede(redis.asyncio.Redis(...), "
            f"near_cache={NEAR_ENTRIES})`. Run in the hit and hot scenarios and in coherence."
        ),
        scenarios=("hit", "hot"),
        coherence=True,
        check=_asyncio_near_cache,
    ),
)

#: Every peer, in the order of the tables: the others, then stampede's.
PEERS: tuple[PeerSpec, ...] = (*_OTHERS, *herdpeers.PEERS, *nearpeers.PEERS, *_STAMPEDE)


#: Why a peer shows what :func:`bench.summary.observations` finds, by peer and finding. Said only
#: when the figures of the run show it.
WHY: dict[str, dict[str, str]] = {
    "naive": {"rebuilds": "nothing coordinates the callers: each one that misses rebuilds"},
    "django": {
        "rebuilds": "`get_or_set` is a `get`, then the rebuild and an `add`: nothing stops concurrent "
        "misses from each rebuilding",
        "hit": "its `RedisCacheClient` makes a new `redis.Redis` object for every call",
    },
    "dogpile": {
        "rebuilds": "after taking the lock, dogpile re-reads the value only if it had none: a caller "
        "that read the stale value just before the refresh landed can take the freed lock and "
        "regenerate again",
        "waiters": "callers that found no value take the Redis lock one after another to re-read it, "
        "each retrying every 0.1 s",
    },
    "redis-lock": {
        "waiters": "waiters must each take the lock in turn to re-read the value, retrying every 0.1 s",
        "expiry": "with no stale value to serve, every caller of an expiry waits for the lock",
    },
    "flask-caching": {
        "rebuilds": "the function's version key expires with the value, and each caller that finds it "
        "gone writes a new random version, so the callers of one expiry look for different keys and "
        "some rebuild more than once; nothing coordinates the misses otherwise",
        "hit": "a memoized call reads the version key and then the value, and hashes its arguments",
    },
    "cashews-lock": {
        "expiry": "every call takes the key's lock, hits too, and a caller that finds it taken tries "
        "again at once: the callers of an expiry get their value one after another",
        "hit": "every call takes the key's lock (`SET NX`) and releases it (a script), hits too",
    },
    "cashews-soft": {
        "rebuilds": "no lock across processes: past the soft TTL each process rebuilds (its calls of "
        "one key share one task), and its callers wait for that",
        "hit": "a call goes through cashews' decorators and a task of its own (`protected=True`)",
    },
    "cashews-early": {
        "rebuilds": "a missing key is rebuilt by every process that misses it (its calls share one "
        "task); only a refresh past `early_ttl` is taken by one caller",
        "hit": "a call goes through cashews' decorators and a task of its own (`protected=True`)",
    },
    "cashews-near": {"rebuilds": "no lock: each process rebuilds a missing key (its calls share one task)"},
    "aiocache": {
        "rebuilds": "`RedLock` makes only the callers in the lock holder's process wait (on an "
        "`asyncio.Event`): callers in the other processes go ahead and rebuild"
    },
    "django-herd": {
        "rebuilds": "nothing locks: every caller that misses rebuilds, and past a value's own expiry "
        "each `get` is a miss with a probability that grows with the seconds since"
    },
    "redis-py-cache": {"rebuilds": "cache-aside: nothing coordinates the misses"},
    "coredis-cache": {"rebuilds": "cache-aside: nothing coordinates the misses"},
}


def spec(name: str) -> PeerSpec:
    for peer in PEERS:
        if peer.name == name:
            return peer
    raise KeyError(f"no peer named {name!r}")


# --- worker side: blocking peers ---------------------------------------------


class _Naive(SyncPeer):
    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def request(self, phase: Phase, rebuild: SyncRebuild) -> Callable[[], Any]:
        return functools.partial(naive_get, self.client, phase.key, phase.ttl, rebuild)

    def write(self, phase: Phase, value: Any) -> None:
        self.client.set(phase.key, pickle.dumps(value, pickle.HIGHEST_PROTOCOL), ex=phase.ttl)


def _locked_get(client: redis.Redis, key: str, ttl: int, rebuild: SyncRebuild) -> Any:
    """Cache-aside with redis-py's lock: one caller rebuilds a missing key, the others wait for it."""
    raw = cast("bytes | None", client.get(key))
    if raw is not None:
        return pickle.loads(raw)
    lock = client.lock(f"{key}:lock", timeout=LOCK_TIMEOUT, blocking_timeout=WAIT_TIMEOUT)
    if not lock.acquire():
        return rebuild()  # waited long enough: serve this caller, store nothing (it holds no lock)
    try:
        raw = cast("bytes | None", client.get(key))  # the holder before us may have stored it
        if raw is not None:
            return pickle.loads(raw)
        value = rebuild()
        client.set(key, pickle.dumps(value, pickle.HIGHEST_PROTOCOL), ex=ttl)
        return value
    finally:
        # A lock that expired under a slow rebuild is not ours to release any more.
        with contextlib.suppress(redis.exceptions.LockError):
            lock.release()


class _RedisLock(_Naive):
    def request(self, phase: Phase, rebuild: SyncRebuild) -> Callable[[], Any]:
        return functools.partial(_locked_get, self.client, phase.key, phase.ttl, rebuild)


class _Django(SyncPeer):
    def __init__(self, url: str, prefix: str) -> None:
        add_django_cache(
            "default",
            {
                "BACKEND": "django.core.cache.backends.redis.RedisCache",
                "LOCATION": url,
                "KEY_PREFIX": f"{prefix}django",
                "OPTIONS": {"socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": 10.0},
            },
        )

    def request(self, phase: Phase, rebuild: SyncRebuild) -> Callable[[], Any]:
        from django.core.cache import caches

        # Looked up in the calling thread: Django keeps one backend instance per thread.
        return functools.partial(caches["default"].get_or_set, phase.key, rebuild, phase.ttl)

    def close(self) -> None:
        from django.core.cache import close_caches

        close_caches()


class _Dogpile(SyncPeer):
    def __init__(self, url: str, phases: Sequence[Phase], pool_size: int) -> None:
        from dogpile.cache import make_region

        self.pool = redis.ConnectionPool.from_url(
            url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=10.0
        )
        warm_pool(self.pool, pool_size)
        # A region is dogpile's unit of expiry policy: one per (ttl, stale_ttl) the phases use.
        self.regions: dict[tuple[int, int], Any] = {}
        for phase in phases:
            policy = (phase.ttl, phase.stale_ttl)
            if policy not in self.regions:
                self.regions[policy] = make_region().configure(
                    "dogpile.cache.redis",
                    expiration_time=phase.ttl,
                    arguments={
                        "connection_pool": self.pool,
                        "redis_expiration_time": phase.ttl + phase.stale_ttl,
                        "distributed_lock": True,
                        "thread_local_lock": False,
                        "lock_timeout": LOCK_TIMEOUT,
                    },
                )

    def request(self, phase: Phase, rebuild: SyncRebuild) -> Callable[[], Any]:
        region = self.regions[(phase.ttl, phase.stale_ttl)]
        return functools.partial(region.get_or_create, phase.key, rebuild)

    def close(self) -> None:
        self.pool.disconnect()


class _FlaskCaching(SyncPeer):
    def __init__(self, url: str, prefix: str, phases: Sequence[Phase]) -> None:
        import flask
        import flask_caching

        self.app = flask.Flask("stampede_bench")
        self.cache = flask_caching.Cache(
            self.app,
            config={
                "CACHE_TYPE": "RedisCache",
                "CACHE_REDIS_URL": url,
                "CACHE_KEY_PREFIX": f"{prefix}flask:",
                "CACHE_OPTIONS": {"socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": 10.0},
            },
        )
        # The memoized function computes whatever its calling thread asked for: memoize keys
        # a call by the function's name and arguments, so it must be one function per timeout
        # (with the same name in every process), not a closure per phase.
        self._current = threading.local()
        self.memoized: dict[int, Callable[[str], Any]] = {}
        for ttl in sorted({phase.ttl for phase in phases}):
            self.memoized[ttl] = self._memoize(ttl)

    def _memoize(self, ttl: int) -> Callable[[str], Any]:
        current = self._current

        def compute(key: str) -> Any:
            return current.rebuild()

        compute.__qualname__ = compute.__name__ = f"bench_value_ttl_{ttl}"
        return cast("Callable[[str], Any]", self.cache.memoize(timeout=ttl)(compute))

    @contextlib.contextmanager
    def session(self, phase: Phase, rebuild: SyncRebuild) -> Iterator[Callable[[], Any]]:
        self._current.rebuild = rebuild
        with self.app.app_context():  # as a request would have
            yield functools.partial(self.memoized[phase.ttl], phase.key)

    def close(self) -> None:
        with self.app.app_context():
            client = getattr(self.cache.cache, "_write_client", None)
            if client is not None:
                client.close()


def _stampede_options(phase: Phase) -> dict[str, Any]:
    """The per-call options of ``get_or_rebuild``, as a user would pass them: only those that
    differ from the defaults."""
    options: dict[str, Any] = {"ttl": phase.ttl, "stale_ttl": phase.stale_ttl}
    if phase.background:
        options["background"] = True
    return options


class _Stampede(SyncPeer):
    def __init__(
        self, client: redis.Redis, *, signing_key: bytes | None = None, near_cache: int | None = None
    ) -> None:
        import stampede

        self.sf = stampede.Stampede(
            client, namespace=NAMESPACE, signing_key=signing_key, near_cache=near_cache
        )

    def request(self, phase: Phase, rebuild: SyncRebuild) -> Callable[[], Any]:
        return functools.partial(self.sf.get_or_rebuild, phase.key, rebuild, **_stampede_options(phase))

    def write(self, phase: Phase, value: Any) -> None:
        self.sf.set(phase.key, value, ttl=phase.ttl, stale_ttl=phase.stale_ttl)

    def drain(self) -> None:
        self.sf.close()  # waits for background refreshes: they add to the records

    def close(self) -> None:
        self.sf.close()


def open_sync(
    name: str, url: str, *, prefix: str, phases: Sequence[Phase], client: redis.Redis, pool_size: int
) -> SyncPeer:
    """Build the blocking peer ``name`` in this process; ``client`` is the process's own client for
    ``url`` (warmed, shared by the peers that use a plain redis-py client)."""
    if name == "naive":
        return _Naive(client)
    if name == "redis-lock":
        return _RedisLock(client)
    if name == "django":
        return _Django(url, prefix)
    if name == "dogpile":
        return _Dogpile(url, phases, pool_size)
    if name == "flask-caching":
        return _FlaskCaching(url, prefix, phases)
    if name == "stampede":
        return _Stampede(client)
    if name == "stampede-signed":
        return _Stampede(client, signing_key=SIGNING_KEY)
    if name == "stampede-near":
        return _Stampede(client, near_cache=NEAR_ENTRIES)
    peer = herdpeers.open_sync(name, url, prefix=prefix, pool_size=pool_size) or nearpeers.open_sync(
        name, url, prefix=prefix, pool_size=pool_size
    )
    if peer is None:
        raise KeyError(f"no blocking peer named {name!r}")
    return peer


# --- worker side: asyncio peers ----------------------------------------------


class _StampedeAsyncio(AsyncPeer):
    def __init__(self, url: str, *, signing_key: bytes | None = None, near_cache: int | None = None) -> None:
        import stampede.asyncio

        self.client = plain_async_client(url)
        self.sf = stampede.asyncio.Stampede(
            self.client, namespace=NAMESPACE, signing_key=signing_key, near_cache=near_cache
        )

    def request(self, phase: Phase, rebuild: AsyncRebuild) -> Callable[[], Awaitable[Any]]:
        return functools.partial(self.sf.get_or_rebuild, phase.key, rebuild, **_stampede_options(phase))

    async def write(self, phase: Phase, value: Any) -> None:
        await self.sf.set(phase.key, value, ttl=phase.ttl, stale_ttl=phase.stale_ttl)

    async def drain(self) -> None:
        await self.sf.aclose()

    async def aclose(self) -> None:
        await self.sf.aclose()
        await self.client.aclose()


async def open_async(name: str, url: str, *, pool_size: int) -> AsyncPeer:
    """Build the asyncio peer ``name``; call it on the event loop it will run on."""
    peer = await _open_async(name, url, pool_size=pool_size)
    pool = peer.client.connection_pool
    connections = []
    try:
        for _ in range(pool_size):
            connections.append(await pool.get_connection())
    finally:
        for connection in connections:
            await pool.release(connection)
    return peer


async def _open_async(name: str, url: str, *, pool_size: int) -> AsyncPeer:
    if name == "stampede-asyncio":
        return _StampedeAsyncio(url)
    if name == "stampede-asyncio-signed":
        return _StampedeAsyncio(url, signing_key=SIGNING_KEY)
    if name == "stampede-asyncio-near":
        return _StampedeAsyncio(url, near_cache=NEAR_ENTRIES)
    peer = await herdpeers.open_async(name, url, pool_size=pool_size) or await nearpeers.open_async(
        name, url, pool_size=pool_size
    )
    if peer is None:
        raise KeyError(f"no asyncio peer named {name!r}")
    return peer
