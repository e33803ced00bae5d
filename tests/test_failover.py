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
from collections.abc import Iterator
from typing import Any

import pytest

import stampede
import stampede.asyncio
from stampede import Event, EventKind
from stampede._core.keys import KeySpace
from stampede.testing import find_valkey_server
from tests.failing import Failing
from tests.helpers import run_threads, wait_until

pytestmark = pytest.mark.slow

#: Long enough for any failover here (about 2.5 s) on a loaded machine.
OPTIONS: dict[str, Any] = {"ttl": 60, "wait_timeout": 30, "lease_ttl": 15}


@pytest.fixture(
    params=["cluster-redis", "cluster-valkey", "sentinel-redis", "sentinel-valkey"],
)
def failing(request: pytest.FixtureRequest) -> Iterator[Failing]:
    kind, server = request.param.split("-")
    with Failing(kind, find_valkey_server() if server == "valkey" else None) as setup:
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


#: redis-py's blocking cluster client forgets a node's connections, unclosed,
#: when a failover replaces the node in its topology (the leaked socket was
#: opened by its own GET, traced to ``redis/cluster.py``'s ``get_connection``);
#: Python reports them as they are collected, in whichever test is running.
REDIS_PY_CLUSTER_LEAK = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@REDIS_PY_CLUSTER_LEAK
def test_values_served_from_replicas_while_the_master_is_gone(failing: Failing, namespace: str) -> None:
    # The values carry a tag whose state is on the master that dies, and the
    # tag states are to be read again every 50 ms: while it does not answer,
    # the states last read stand (nobody can change them meanwhile).
    seen, on_event = _events()
    sf = stampede.Stampede.from_url(
        failing.url, namespace=namespace, on_event=on_event, tag_check_interval=0.05, **OPTIONS
    )
    names = [f"key-{i}" for i in range(12)]
    space = KeySpace(namespace)
    victim = failing.master_of(space(names[0]).value)
    group = next(
        tag
        for tag in (f"group-{n}" for n in itertools.count())
        if failing.master_of(sf._settings.tags.key(tag.encode())) is victim
    )
    rebuilds = {name: Versions() for name in names}
    for name in names:
        assert sf.get_or_rebuild(name, rebuilds[name].next, tags=[group]) == 1
    seen.clear()

    def serve() -> None:
        for name in names:
            assert sf.get_or_rebuild(name, rebuilds[name].next, tags=[group]) == 1

    errors = failing.serve_through_failover(KeySpace(namespace)(names[0]).value, serve, threads=16)
    sf.close()
    assert errors == []
    assert seen[EventKind.LEASE_WON] == 0  # fresh values: never a refresh, not even tried
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


@REDIS_PY_CLUSTER_LEAK
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
    assert sf.get_many(["k", "absent"]) == {"k": "kept"}  # so does a many-key read
    assert [event.kind for event in events].count(EventKind.REPLICA_HIT) == 3
    sf.close()


@pytest.fixture(autouse=True)
def _collected() -> Iterator[None]:
    # Sockets left open show up as warnings of the test that leaked them.
    yield
    gc.collect()


@pytest.mark.parametrize("failing", ["sentinel-redis", "sentinel-valkey"], indirect=True)
def test_a_near_cache_is_dropped_in_a_failover_and_coherent_with_the_new_master(
    failing: Failing, namespace: str
) -> None:
    reader = stampede.Stampede.from_url(failing.url, namespace=namespace, near_cache=100, **OPTIONS)
    writer = stampede.Stampede.from_url(failing.url, namespace=namespace, **OPTIONS)
    near = reader._near
    assert near is not None
    wait_until(lambda: near.live, 10)
    writer.set("k", "before")

    def kept(value: str) -> bool:
        return reader.get_or_rebuild("k", lambda: "rebuilt") == value and len(near) == 1

    wait_until(lambda: kept("before"))
    flushes = near.counts["flushes"]
    failing.kill_master_of(KeySpace(namespace)("k").value)
    wait_until(lambda: near.counts["flushes"] > flushes, 30)  # the old master's connection is gone
    wait_until(lambda: _written(writer, "after"), 30)  # to the promoted master
    assert reader.get_or_rebuild("k", lambda: "rebuilt") == "after"
    wait_until(lambda: near.live and kept("after"), 30)  # tracking again, on the new master
    for i in range(20):
        writer.set("k", f"new-{i}")
        assert reader.get_or_rebuild("k", lambda: "rebuilt") == f"new-{i}"
    reader.close()
    writer.close()


def _written(sf: stampede.Stampede, value: str) -> bool:
    try:
        sf.set("k", value)
    except stampede.RedisUnavailableError:
        return False
    return True
