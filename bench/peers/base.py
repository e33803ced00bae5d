"""What every peer module shares: :class:`PeerSpec` (a peer as the parent sees it), the worker-side
:class:`SyncPeer` and :class:`AsyncPeer`, the settings every peer is given, and small helpers.

:mod:`bench.peers` re-exports all of it and gathers the peers of
:mod:`bench.peers`, :mod:`bench.herdpeers` and :mod:`bench.nearpeers` into one
list; the other modules import from there.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import pickle
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from .._common.phase import Phase

__all__ = [
    "LOAD_SCENARIOS",
    "LOCK_TIMEOUT",
    "NEAR_ENTRIES",
    "SIGNING_KEY",
    "SOCKET_TIMEOUT",
    "STALE_TTL",
    "WAIT_TIMEOUT",
    "AsyncPeer",
    "AsyncRebuild",
    "PeerSpec",
    "SyncPeer",
    "SyncRebuild",
    "add_django_cache",
    "naive_get",
    "plain_async_client",
    "warm_pool",
]

#: Seconds a stale value stays servable, for the peers that can serve one (stampede, dogpile).
STALE_TTL = 30
#: Seconds a lock lives if its holder dies: stampede's default ``lease_ttl``, given to every lock.
LOCK_TIMEOUT = 5
#: Seconds a caller waits for someone else's rebuild: stampede's default ``wait_timeout``.
WAIT_TIMEOUT = 10
#: Every client's socket timeout: long, so that a loaded 2-core machine does not turn into errors.
SOCKET_TIMEOUT = 30.0
#: The signed stampede peers' ``signing_key``: fixed, 32 bytes (stampede wants at least 16).
SIGNING_KEY = b"bench-signing-key-" + b"0" * 14
#: How many values every near cache (a copy in process memory) may keep.
NEAR_ENTRIES = 10_000
#: The scenarios of the worker processes' load (:mod:`bench._workers`), as opposed to ``coherence``.
LOAD_SCENARIOS = ("hit", "cold", "hot")

SyncRebuild = Callable[[], Any]
AsyncRebuild = Callable[[], Awaitable[Any]]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a dotted name whose parent package is missing
        return False


@dataclass(frozen=True)
class PeerSpec:
    """One peer as the parent sees it.

    Attributes:
        name: its ``--peer`` name.
        label: its name in the tables (Markdown).
        short: its name on the plot.
        modules: what must be importable to run it.
        distributions: the packages whose versions the notes give.
        is_async: its callers are asyncio tasks rather than threads.
        stale: it can serve the old value while one caller refreshes (it is given ``STALE_TTL``).
        config: how it is configured, for the notes (Markdown).
        scenarios: the load scenarios it runs in (``hit``, ``cold``, ``hot``); ``None``: all of them.
            A peer that only varies another on one axis runs where that axis shows, so as not
            to repeat the other's rows elsewhere (and lengthen the run).
        coherence: it also runs in the coherence scenario (:mod:`bench.coherence`): it keeps
            copies in process memory, or it is a baseline for those that do. Its peer
            classes implement ``write``.
        min_redis: the oldest Redis (not Valkey) server it works with, if it needs a newer one
            than any; :mod:`bench._servers` finds one.
        check: says why it cannot run here, beyond a missing module (``None``: it can).
    """

    name: str
    label: str
    short: str
    modules: tuple[str, ...]
    distributions: tuple[str, ...]
    is_async: bool
    stale: bool
    config: str
    scenarios: tuple[str, ...] | None = None
    coherence: bool = False
    min_redis: tuple[int, int] | None = None
    check: Callable[[], str | None] | None = None

    def runs(self, scenario: str) -> bool:
        """Whether it takes part in ``scenario``."""
        if scenario == "coherence":
            return self.coherence
        return scenario in (self.scenarios or LOAD_SCENARIOS)

    def taking_part(self) -> str:
        """The scenarios it runs in, for messages: ``hit, hot and coherence``."""
        names = [*(self.scenarios or LOAD_SCENARIOS), *(["coherence"] if self.coherence else [])]
        return " and ".join(filter(None, [", ".join(names[:-1]), names[-1]]))

    def missing(self) -> list[str]:
        """The modules of :attr:`modules` that cannot be imported here."""
        return [module for module in self.modules if not _importable(module)]

    def unavailable(self) -> str | None:
        """Why it cannot run here (a sentence without its final stop), or ``None``."""
        missing = self.missing()
        if missing:
            return (
                f"{', '.join(missing)} not installed "
                "(`pip install redis-stampede[bench]` installs every peer)"
            )
        return self.check() if self.check is not None else None

    def versions(self) -> str:
        found = []
        for dist in self.distributions:
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                found.append(f"{dist} {importlib.metadata.version(dist)}")
        return ", ".join(found)

    def row_label(self, row: str) -> str:
        return f"{self.label}, `background=True`" if row.endswith("+background") else self.label

    def row_short(self, row: str) -> str:
        return f"{self.short} (background)" if row.endswith("+background") else self.short


# --- worker side ---------------------------------------------------------------


class SyncPeer:
    """A peer driven by threads. Subclasses implement :meth:`request`."""

    def request(self, phase: Phase, rebuild: SyncRebuild) -> Callable[[], Any]:
        raise NotImplementedError

    @contextlib.contextmanager
    def session(self, phase: Phase, rebuild: SyncRebuild) -> Iterator[Callable[[], Any]]:
        """One caller's part of ``phase``: yields what makes one request."""
        yield self.request(phase, rebuild)

    def write(self, phase: Phase, value: Any) -> None:
        """Store ``value`` under the phase's key through the peer's own write API (coherence)."""
        raise NotImplementedError(f"{type(self).__name__} has no write for the coherence scenario")

    def drain(self) -> None:
        """Wait for work still running in the background (none, but for stampede's)."""

    def close(self) -> None:
        """Release the peer's connections."""


class AsyncPeer:
    """A peer driven by asyncio tasks, on the worker's event loop. ``client`` is a plain
    ``redis.asyncio`` client of its server, which the benchmark also uses to count rebuilds and
    for the hit path's baseline (never a caching one)."""

    client: Any

    def request(self, phase: Phase, rebuild: AsyncRebuild) -> Callable[[], Awaitable[Any]]:
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def session(
        self, phase: Phase, rebuild: AsyncRebuild
    ) -> AsyncIterator[Callable[[], Awaitable[Any]]]:
        yield self.request(phase, rebuild)

    async def write(self, phase: Phase, value: Any) -> None:
        """:meth:`SyncPeer.write`, on the event loop."""
        raise NotImplementedError(f"{type(self).__name__} has no write for the coherence scenario")

    async def drain(self) -> None:
        pass

    async def aclose(self) -> None:
        await self.client.aclose()


def naive_get(client: Any, key: str, ttl: int, rebuild: SyncRebuild) -> Any:
    """Cache-aside as most code writes it: no lock, every miss rebuilds. ``client``: redis-py's,
    with or without its client-side cache."""
    raw = cast("bytes | None", client.get(key))
    if raw is not None:
        return pickle.loads(raw)
    value = rebuild()
    client.set(key, pickle.dumps(value, pickle.HIGHEST_PROTOCOL), ex=ttl)
    return value


def plain_async_client(url: str) -> Any:
    """A ``redis.asyncio`` client of ``url``, configured as every peer's."""
    import redis.asyncio

    return redis.asyncio.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=10.0)


def add_django_cache(alias: str, config: dict[str, Any]) -> None:
    """Add the cache ``alias`` to this process's Django settings, configuring Django on first use.

    Several Django peers may run in one worker process, and Django is configured only once: the
    first adds a placeholder ``default`` (Django wants one), the others add their alias to
    ``CACHES``, which Django reads when a cache is first used (after every peer is opened).
    """
    import django
    from django.conf import settings

    if settings.configured:
        settings.CACHES[alias] = config
        return
    caches = {"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}, alias: config}
    settings.configure(CACHES=caches)
    django.setup()


def warm_pool(pool: Any, size: int) -> None:
    """Open ``size`` connections now, so that no measured request pays for a TCP connect.

    The pool connects (and checks) every connection it hands out.
    """
    connections = []
    try:
        for _ in range(size):
            connections.append(pool.get_connection())
    finally:
        for connection in connections:
            pool.release(connection)
