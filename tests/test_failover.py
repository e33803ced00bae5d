"""Failovers, for real: the master of a key is killed on a local Redis Cluster
and on a Sentinel setup, between two rebuilds and in the middle of one.

What users rely on: while the master is gone, callers of keys a replica holds
are served the replica's copy, not an error; once a replica is promoted,
nothing fails; at most one extra rebuild; no caller is served a value older
than one it already had. Each test starts (and breaks) servers of its own.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import stampede
import stampede.asyncio
from stampede import Event, EventKind
from stampede._keys import KeySpace
from stampede.testing import RedisCluster, RedisSentinel, RedisServer, find_valkey_server
from tests.helpers import run_threads, wait_until

pytestmark = pytest.mark.slow

#: Long enough for any failover here (about 2.5 s) on a loaded machine.
OPTIONS: dict[str, Any] = {"ttl": 60, "wait_timeout": 30, "lease_ttl": 15}


class Failing:
    """A cluster or Sentinel setup whose master of a key can be killed."""

    def __init__(self, kind: str, binary: str | None) -> None:
        self.kind = kind
        self.setup: RedisCluster | RedisSentinel = (
            RedisCluster(binary=binary) if kind == "cluster" else RedisSentinel(binary=binary)
        )

    @property
    def url(self) -> str:
        url = self.setup.url
        return url.replace("redis://", "redis+cluster://") if self.kind == "cluster" else url

    def master_of(self, name: bytes) -> RedisServer:
        if isinstance(self.setup, RedisCluster):
            return self.setup.master_of(name)
        return self.setup.current_master()

    def kill_master_of(self, name: bytes) -> None:
        """Kill the master of ``name`` once its replicas have caught up, then
        return once a replica has taken over (bounded: the test fails after 30 s)."""
        wait_until(self.setup.in_sync, 10)
        victim = self.master_of(name)
        victim.stop()
        wait_until(lambda: self._promoted(name, victim), 30)

    def kill_master_without_failover(self, name: bytes) -> None:
        """Kill the master of ``name`` with failover disabled: its replicas stay replicas."""
        wait_until(self.setup.in_sync, 10)
        if isinstance(self.setup, RedisCluster):
            for node in self.setup.nodes:
                with redis.Redis(port=node.port, socket_timeout=5) as client:
                    client.config_set("cluster-replica-no-failover", "yes")
        else:
            for sentinel in self.setup.sentinels:
                with redis.Redis(port=sentinel.port, socket_timeout=5) as client:
                    client.execute_command(
                        "SENTINEL SET", self.setup.service, "down-after-milliseconds", 3_600_000
                    )
        self.master_of(name).stop()

    def _promoted(self, name: bytes, victim: RedisServer) -> bool:
        try:
            return self.master_of(name) is not victim
        except (redis.RedisError, RuntimeError):
            return False


@pytest.fixture(
    params=["cluster-redis", "cluster-valkey", "sentinel-redis", "sentinel-valkey"],
)
def failing(request: pytest.FixtureRequest) -> Iterator[Failing]:
    kind, server = request.param.split("-")
    setup = Failing(kind, find_valkey_server() if server == "valkey" else None)
    with setup.setup:
        if isinstance(setup.setup, RedisCluster):
            for node in setup.setup.nodes:
                with redis.Redis(port=node.port, socket_timeout=5) as client:
                    # As the README advises: a cluster that marked a master
                    # failed refuses every read until the promotion otherwise,
                    # a replica's too.
                    client.config_set("cluster-allow-reads-when-down", "yes")
        yield setup


class Versions:
    """A rebuild function returning 1, 2, 3...: a served value's age is its number."""

    def __init__(self) -> None:
        self._numbers = itertools.count(1)
        self.count = 0

    def next(self) -> int:
        self.count = n = next(self._numbers)
        return n


def _events() -> tuple[collections.Counter[EventKind], Any]:
    seen: collections.Counter[EventKind] = collections.Counter()
    return seen, lambda event: seen.update([event.kind])


# --- between two rebuilds: every value is fresh, its master dies ----------------


# redis-py's cluster client forgets a node's connections, unclosed, when a
# failover replaces the node in its topology (the leaked socket is one its
# own GET opened); Python reports them when they are collected.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_values_served_from_replicas_while_the_master_is_gone(failing: Failing, namespace: str) -> None:
    seen, on_event = _events()
    sf = stampede.Stampede.from_url(failing.url, namespace=namespace, on_event=on_event, **OPTIONS)
    names = [f"key-{i}" for i in range(12)]
    rebuilds = {name: Versions() for name in names}
    for name in names:
        assert sf.get_or_rebuild(name, rebuilds[name].next) == 1
    errors: list[BaseException] = []
    stop = threading.Event()

    def caller() -> None:
        while not stop.is_set():
            for name in names:
                try:
                    assert sf.get_or_rebuild(name, rebuilds[name].next) == 1
                except BaseException as exc:
                    errors.append(exc)

    threads = [threading.Thread(target=caller, daemon=True) for _ in range(16)]
    for thread in threads:
        thread.start()
    try:
        failing.kill_master_of(KeySpace(namespace)(names[0]).value)
        time.sleep(0.5)  # callers go on against the promoted master
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    sf.close()
    assert errors == []
    _served_from_replicas(failing, seen)
    assert [versions.count for versions in rebuilds.values()] == [1] * len(names)


def test_asyncio_values_served_from_replicas_while_the_master_is_gone(
    failing: Failing, namespace: str
) -> None:
    seen, on_event = _events()
    names = [f"key-{i}" for i in range(12)]
    rebuilds = {name: Versions() for name in names}
    errors: list[BaseException] = []

    async def main() -> None:
        sf = stampede.asyncio.Stampede.from_url(
            failing.url, namespace=namespace, on_event=on_event, **OPTIONS
        )
        for name in names:
            assert await sf.get_or_rebuild(name, rebuilds[name].next) == 1
        stop = asyncio.Event()

        async def caller() -> None:
            while not stop.is_set():
                for name in names:
                    try:
                        assert await sf.get_or_rebuild(name, rebuilds[name].next) == 1
                    except BaseException as exc:
                        errors.append(exc)
                await asyncio.sleep(0)

        tasks = [asyncio.create_task(caller()) for _ in range(100)]
        try:
            await asyncio.to_thread(failing.kill_master_of, KeySpace(namespace)(names[0]).value)
            await asyncio.sleep(0.5)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
            await sf.aclose()

    asyncio.run(main())
    assert errors == []
    _served_from_replicas(failing, seen)
    assert [versions.count for versions in rebuilds.values()] == [1] * len(names)


def _served_from_replicas(failing: Failing, seen: collections.Counter[EventKind]) -> None:
    # A Sentinel-managed client fails at once when its master is gone, and the
    # callers get the replica's copy. redis-py's cluster client often retries
    # until the promotion instead (on other nodes, which redirect it): its
    # callers wait through the failover, with no error either way.
    # test_replica_hits_are_reported shows the cluster's replica reads.
    if failing.kind == "sentinel":
        assert seen[EventKind.REPLICA_HIT] > 0


# --- in the middle of a rebuild: the lease holder's master dies --------------------


def test_master_killed_during_a_rebuild(failing: Failing, namespace: str) -> None:
    # Two instances on two clients: the callers of two processes.
    sides = [stampede.Stampede.from_url(failing.url, namespace=namespace, **OPTIONS) for _ in range(2)]
    versions = Versions()
    started, finish = threading.Event(), threading.Event()

    def rebuild() -> int:
        started.set()
        finish.wait(30)
        return versions.next()

    turn = itertools.count()

    def caller() -> tuple[int, int]:
        side = sides[next(turn) % 2]
        first = side.get_or_rebuild("cold", rebuild)
        return first, side.get_or_rebuild("cold", rebuild)

    outcome: list[Any] = []
    callers = threading.Thread(target=lambda: outcome.extend(run_threads(64, caller)), daemon=True)
    callers.start()
    assert started.wait(30)
    failing.kill_master_of(KeySpace(namespace)("cold").value)
    finish.set()
    callers.join(60)
    assert not callers.is_alive()
    stored = sides[0].get("cold")
    for side in sides:
        side.close()
    assert [result for result in outcome if isinstance(result, BaseException)] == []
    assert versions.count <= 2  # at most one extra rebuild
    assert all(first <= second for first, second in outcome)  # never older than what one had
    assert stored is not None
    assert stored.value >= max(second for _, second in outcome)


def test_asyncio_master_killed_during_a_rebuild(failing: Failing, namespace: str) -> None:
    versions = Versions()
    outcome: list[Any] = []

    async def main() -> None:
        sides = [
            stampede.asyncio.Stampede.from_url(failing.url, namespace=namespace, **OPTIONS) for _ in range(2)
        ]
        started, finish = asyncio.Event(), asyncio.Event()

        async def rebuild() -> int:
            started.set()
            await finish.wait()
            return versions.next()

        async def caller(side: stampede.asyncio.Stampede) -> tuple[int, int]:
            first: int = await side.get_or_rebuild("cold", rebuild)
            second: int = await side.get_or_rebuild("cold", rebuild)
            return first, second

        tasks = [asyncio.create_task(caller(sides[i % 2])) for i in range(400)]
        await asyncio.wait_for(started.wait(), 30)
        await asyncio.to_thread(failing.kill_master_of, KeySpace(namespace)("cold").value)
        finish.set()
        outcome.extend(await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60))
        stored = await sides[0].get("cold")
        outcome.append(("stored", stored.value if stored is not None else None))
        for side in sides:
            await side.aclose()

    asyncio.run(main())
    (_, stored), served = outcome[-1], outcome[:-1]
    assert [result for result in served if isinstance(result, BaseException)] == []
    assert versions.count <= 2
    assert all(first <= second for first, second in served)
    assert stored is not None
    assert stored >= max(second for _, second in served)


def test_replica_hits_are_reported(failing: Failing, namespace: str) -> None:
    events: list[Event] = []
    sf = stampede.Stampede.from_url(failing.url, namespace=namespace, on_event=events.append, **OPTIONS)
    sf.set("k", "kept")
    failing.kill_master_without_failover(KeySpace(namespace)("k").value)
    entry = sf.get("k")  # a plain read falls back too
    assert entry is not None
    assert entry.value == "kept"
    assert sf.get_or_rebuild("k", lambda: "rebuilt") == "kept"
    assert [event.kind for event in events].count(EventKind.REPLICA_HIT) == 2
    sf.close()


@pytest.fixture(autouse=True)
def _collected() -> Iterator[None]:
    # Sockets left open show up as warnings of the test that leaked them.
    yield
    gc.collect()
