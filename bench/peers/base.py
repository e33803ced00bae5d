"""What every peer module shares: :class:`PeerSpec` (a peer as the parent of the side-by-side run
sees it), the shapes the benchmarks drive a library through (:class:`SyncPeer` and
:class:`AsyncPeer` in the herd's worker processes, :class:`Tagged` and :class:`Batch` in the
groups benchmark), the settings every peer is given, and small helpers.

:mod:`bench.peers` gathers the peers of every module into one list.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._common.installed import importable
from .._common.phase import Phase

if TYPE_CHECKING:
    import redis

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
    "Batch",
    "BatchRebuild",
    "Opening",
    "PeerSpec",
    "SyncPeer",
    "SyncRebuild",
    "Tagged",
    "awarm_pool",
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
#: The scenarios of the worker processes' load (:mod:`bench.herd._workers`), as opposed to
#: ``coherence``.
LOAD_SCENARIOS = ("hit", "cold", "hot")

SyncRebuild = Callable[[], Any]
AsyncRebuild = Callable[[], Awaitable[Any]]
#: A batch's rebuild: the values of the keys it is given, by key.
BatchRebuild = Callable[[list[str]], dict[str, Any]]


@dataclass(frozen=True)
class Opening:
    """What a worker process opens a peer with: the peer's server, how many connections to open
    before anything is measured, the run's key prefix, the phases the peer runs there, and (for
    the blocking peers) the process's own client of that server, shared by the peers that use a
    plain redis-py client."""

    url: str
    pool_size: int
    prefix: str = ""
    phases: Sequence[Phase] = ()
    client: redis.Redis | None = None

    def plain_client(self) -> redis.Redis:
        """The process's own client of the server."""
        if self.client is None:
            raise ValueError(f"a peer of {self.url} is opened with the process's own client")
        return self.client


@dataclass(frozen=True)
class PeerSpec:
    """One peer as the parent sees it, and how a worker opens it.

    Attributes:
        name: its ``--peer`` name.
        label: its name in the tables (Markdown).
        short: its name on the plot.
        modules: what must be importable to run it.
        distributions: the packages whose versions the notes give.
        stale: it can serve the old value while one caller refreshes (it is given ``STALE_TTL``).
        config: how it is configured, for the notes (Markdown).
        open_sync: makes the peer in a worker process, for a peer driven by threads.
        open_async: makes it on the worker's event loop, for a peer driven by asyncio tasks
            (exactly one of the two is given).
        scenarios: the load scenarios it runs in (``hit``, ``cold``, ``hot``); ``None``: all of them.
            A peer that only varies another on one axis runs where that axis shows, so as not
            to repeat the other's rows elsewhere (and lengthen the run).
        coherence: it also runs in the coherence scenario (:mod:`bench.herd.coherence`): it keeps
            copies in process memory, or it is a baseline for those that do. Its peer
            classes implement ``write``.
        min_redis: the oldest Redis (not Valkey) server it works with, if it needs a newer one
            than any; :mod:`bench._common.servers` finds one.
        check: says why it cannot run here, beyond a missing module (``None``: it can).
        why: why it shows what :func:`bench.herd.summary.observations` finds, by finding
            (``rebuilds``, ``waiters``, ``expiry``, ``hit``); said only when the figures of the
            run show it.
    """

    name: str
    label: str
    short: str
    modules: tuple[str, ...]
    distributions: tuple[str, ...]
    stale: bool
    config: str
    open_sync: Callable[[Opening], SyncPeer] | None = None
    open_async: Callable[[Opening], Awaitable[AsyncPeer]] | None = None
    scenarios: tuple[str, ...] | None = None
    coherence: bool = False
    min_redis: tuple[int, int] | None = None
    check: Callable[[], str | None] | None = None
    why: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if (self.open_sync is None) == (self.open_async is None):
            raise ValueError(f"peer {self.name!r}: give one of open_sync and open_async")

    @property
    def is_async(self) -> bool:
        """Its callers are asyncio tasks rather than threads."""
        return self.open_async is not None

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
        return [module for module in self.modules if not importable(module)]

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


# --- worker side of the herd ---------------------------------------------------------


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


# --- the groups benchmark's shapes ---------------------------------------------------


class Tagged:
    """One library's tagged read and group invalidation, on the running event loop."""

    async def read(self, key: str, rebuild: AsyncRebuild) -> Any:
        raise NotImplementedError

    async def invalidate(self, tag: str) -> None:
        raise NotImplementedError

    async def stored(self, keys: Sequence[str]) -> list[Any]:
        """The values stored under ``keys`` (``None`` where there is none), read in one go, rebuilding
        nothing."""
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError


class Batch:
    """One library's batch read, blocking."""

    def get_many(self, keys: list[str], rebuild_many: BatchRebuild) -> dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


# --- helpers -------------------------------------------------------------------------


def plain_async_client(url: str) -> Any:
    """A ``redis.asyncio`` client of ``url``, configured as every peer's."""
    import redis.asyncio

    return redis.asyncio.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=10.0)


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


async def awarm_pool(pool: Any, size: int) -> None:
    """:func:`warm_pool` for a ``redis.asyncio`` pool."""
    connections = []
    try:
        for _ in range(size):
            connections.append(await pool.get_connection())
    finally:
        for connection in connections:
            await pool.release(connection)
