"""A real stampede in one process, and fencing that trusts only Redis.

Hundreds of callers of one cold key in ONE process, on redis-py's default
connection pool (100 connections, raising at once when empty): one rebuild,
no errors, and the connections held while waiting do not grow with the
number of waiters. Then the fencing bugs, each reproduced on real Redis.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio

import stampede
import stampede.asyncio
from stampede._async.reads import MOST_READS
from stampede._core.keys import KeySpace
from stampede.testing import ConnectionPeak
from tests.helpers import Rebuilds, run_threads, wait_until

pytestmark = pytest.mark.slow

CROWD = 400


@pytest.fixture
def own_url(server: Any) -> str:
    """A server of the test's own: its connection count is this test's alone."""
    return str(server.url)


def test_threads_of_one_process_share_one_rebuild_and_a_bounded_number_of_connections(own_url: str) -> None:
    client = redis.Redis.from_url(own_url, socket_timeout=5)
    sf = stampede.Stampede(client, namespace="crowd")
    rebuild = Rebuilds(delay=0.5)
    with ConnectionPeak(own_url) as conns:
        results = run_threads(CROWD, lambda: sf.get_or_rebuild("cold", rebuild))
    assert results == ["v1"] * CROWD
    assert rebuild.count == 1
    # The leader's commands, the shared first GETs and the subscriber: not one per waiter.
    assert conns.peak <= MOST_READS + 5
    sf.close()
    client.close()


def test_read_and_commit_from_hundreds_of_threads_hand_out_one_lease(own_url: str) -> None:
    client = redis.Redis.from_url(own_url, socket_timeout=5)
    sf = stampede.Stampede(client, namespace="crowd")
    rebuilds = Rebuilds(delay=0.5)

    def request() -> Any:
        read = sf.read("page")
        if read.found:
            return read.value
        value = rebuilds()
        if read.lease is not None:
            sf.commit(read.lease, value)
        return value

    with ConnectionPeak(own_url) as conns:
        results = run_threads(CROWD, request)
    assert results == ["v1"] * CROWD
    assert rebuilds.count == 1
    assert conns.peak <= MOST_READS + 5
    sf.close()
    client.close()


@pytest.mark.parametrize("split", [False, True], ids=["get_or_rebuild", "read-commit"])
def test_tasks_of_one_loop_share_one_rebuild_and_a_bounded_number_of_connections(
    own_url: str, split: bool
) -> None:
    runs = 0

    async def rebuild() -> str:
        nonlocal runs
        runs += 1
        await asyncio.sleep(0.5)
        return f"v{runs}"

    async def crowd() -> list[Any]:
        sf = stampede.asyncio.Stampede(redis.asyncio.Redis.from_url(own_url, socket_timeout=5))

        async def one() -> Any:
            if not split:
                return await sf.get_or_rebuild("cold", rebuild)
            read = await sf.read("cold")
            if read.found:
                return read.value
            value = await rebuild()
            if read.lease is not None:
                await sf.commit(read.lease, value)
            return value

        try:
            return await asyncio.gather(*[one() for _ in range(CROWD)], return_exceptions=True)
        finally:
            await sf.aclose()
            await sf.client.aclose()

    with ConnectionPeak(own_url) as conns:
        results = asyncio.run(crowd())
    assert results == ["v1"] * CROWD
    assert runs == 1
    assert conns.peak <= MOST_READS + 5


def test_a_blocking_call_on_an_event_loop_thread_never_waits_for_a_lease(
    sf: stampede.Stampede, client: redis.Redis
) -> None:
    # Someone else (another process) holds the lease of a key nobody stored.
    other = stampede.Stampede(client, namespace=sf.namespace)
    held = other.read("page")
    assert held.lease is not None
    events: list[stampede.EventKind] = []
    watcher = stampede.Stampede(client, namespace=sf.namespace, on_event=lambda e: events.append(e.kind))

    async def in_a_view() -> tuple[stampede.Read, Any]:
        # What Django's cache middleware does on an async view: the blocking
        # API, on the loop's own thread. Waiting here would freeze the loop.
        return watcher.read("page", wait_timeout=30), watcher.get_or_rebuild(
            "page", lambda: "alone", wait_timeout=30
        )

    read, value = asyncio.run(asyncio.wait_for(in_a_view(), 10))
    assert read == stampede.Read(False)  # a miss without the lease: render, like stock Django
    assert value == "alone"  # rebuilt for itself, not stored
    assert stampede.EventKind.NO_WAIT in events
    assert other.get("page") is None
    other.release(held.lease)


def test_a_delete_made_while_a_split_lease_rebuilds_is_not_undone_by_its_set(
    sf: stampede.Stampede,
) -> None:
    # Django: a request renders k; meanwhile a model's save() deletes k; the
    # request's set (a lapsed-tolerant commit) must not bring the old page back.
    sf.set("k", "old", ttl=0.05, stale_ttl=60)
    time.sleep(0.1)  # stale
    read = sf.read("k")
    assert read.lease is not None
    sf.delete("k")
    assert sf.commit(read.lease, "rendered from old data", store_if_lapsed=True) is False
    assert sf.get("k") is None
    # The same after an invalidate (the data changed again while it rendered).
    sf.set("k", "old", ttl=0.05, stale_ttl=60)
    time.sleep(0.1)
    read = sf.read("k")
    assert read.lease is not None
    sf.invalidate("k")
    assert sf.commit(read.lease, "rendered from old data", store_if_lapsed=True) is False
    entry = sf.get("k")
    assert entry is not None
    assert (entry.value, entry.is_fresh()) == ("old", False)


def test_an_incr_made_while_a_split_lease_rebuilds_is_not_undone_by_its_set(sf: stampede.Stampede) -> None:
    sf.set("hits", 10, ttl=0.05, stale_ttl=60)
    time.sleep(0.1)  # stale: the next read gets the lease
    read = sf.read("hits")
    assert read.lease is not None
    assert sf.incr("hits") == 11
    assert sf.commit(read.lease, 10, store_if_lapsed=True) is False
    entry = sf.get("hits")
    assert entry is not None
    assert entry.value == 11


@pytest.mark.parametrize("wipe", ["clear", "delete_prefix"])
@pytest.mark.usefixtures("settled")
def test_a_rebuild_in_flight_across_clear_cannot_store_what_it_read_before(
    sf: stampede.Stampede, client: redis.Redis, keys: KeySpace, wipe: str
) -> None:
    sf.set("page:1", "old", ttl=60)
    read = sf.read("page:2")
    assert read.lease is not None
    assert (sf.clear() if wipe == "clear" else sf.delete_prefix("page:")) == 1
    assert client.exists(keys("page:2").lease) == 0  # its waiters are free to go on
    assert sf.commit(read.lease, "rendered from old data", store_if_lapsed=True) is False
    assert sf.get("page:2") is None


@pytest.mark.usefixtures("settled")
def test_an_evicted_lease_is_no_evidence_that_nothing_changed(sf: stampede.Stampede, keys: KeySpace) -> None:
    # maxmemory evicted the lease while its holder rebuilt, and with it the
    # only evidence that nothing was written, deleted or invalidated since it
    # was won (a write may have come and its value been evicted too): the
    # commit stores nothing. The caller is served what it rebuilt; the next
    # read rebuilds.
    rebuilds = Rebuilds()

    def rebuild() -> str:
        sf.client.delete(keys("evicted").lease)
        return rebuilds()

    assert sf.get_or_rebuild("evicted", rebuild) == "v1"
    assert sf.get("evicted") is None
    assert sf.get_or_rebuild("evicted", rebuilds) == "v2"
    assert sf.get("evicted").value == "v2"


def test_a_rebuild_across_a_restart_cannot_store_what_it_read_before_a_delete(server: Any) -> None:
    # The restart (no persistence) lost the lease's record with everything
    # else: nothing vouches that the key was not written meanwhile, and the
    # late commit stores nothing.
    client = redis.Redis.from_url(server.url, socket_timeout=5)
    sf = stampede.Stampede(client, namespace="restarted")
    read = sf.read("k")
    assert read.lease is not None
    sf.delete("k")  # the data changed while the holder rebuilt from the old
    server.stop()
    server.start()
    assert sf.commit(read.lease, "rendered from old data", store_if_lapsed=True) is False
    assert sf.get("k") is None
    sf.close()
    client.close()


def test_flushall_under_a_crowd_leaves_no_one_waiting_and_fencing_working(own_url: str) -> None:
    # Two processes' worth of callers (two instances: each one's followers
    # share its flight; the other's leader waits on Redis). FLUSHALL drops
    # the lease it waits on without a word: the waiter must find that out,
    # and rebuild, rather than wait for a message that never comes.
    clients = [redis.Redis.from_url(own_url, socket_timeout=5) for _ in range(2)]
    instances = [stampede.Stampede(client, namespace="flushall") for client in clients]
    turns = itertools.count()
    rebuilds = Rebuilds(delay=0.3)
    flushed = threading.Event()

    def rebuild() -> str:
        value = rebuilds()
        if not flushed.is_set():
            flushed.set()
            instances[0].client.flushall()
        return str(value)

    results = run_threads(50, lambda: instances[next(turns) % 2].get_or_rebuild("flushed", rebuild))
    assert all(isinstance(result, str) for result in results), results
    assert 1 <= rebuilds.count <= 3
    # After the flush the fencing works as before.
    sf = instances[1]
    read = sf.read("after")
    assert read.lease is not None
    sf.delete("after")
    assert sf.commit(read.lease, "old", store_if_lapsed=True) is False
    for instance in instances:
        instance.close()
        instance.client.close()


def test_a_caller_that_joins_a_rebuild_overtaken_by_a_newer_write_is_not_served_older_data(
    redis_url: str, client: redis.Redis, namespace: str
) -> None:
    here = stampede.Stampede(client, namespace=namespace)  # this process
    there = stampede.Stampede(redis.Redis.from_url(redis_url), namespace=namespace)  # another
    data = {"version": 1}
    release = threading.Event()
    started = threading.Event()

    def slow() -> int:
        version = data["version"]  # read before the writes below
        started.set()
        release.wait(10)
        return version

    leader = concurrent.futures.ThreadPoolExecutor(2)
    led = leader.submit(here.get_or_rebuild, "k", slow)
    assert started.wait(10)
    data["version"] = 2
    there.delete("k")  # the data changed: the rebuild in flight is void
    assert there.get_or_rebuild("k", lambda: data["version"]) == 2
    assert here.get_or_rebuild("k", lambda: data["version"]) == 2  # this caller now has version 2
    data["version"] = 3
    there.delete("k")
    # The same caller misses and joins the rebuild still in flight here.
    followed = leader.submit(here.get_or_rebuild, "k", lambda: data["version"])
    wait_until(lambda: here._calls.flights.followers() == 1)
    release.set()
    assert led.result(10) == 1  # its own caller asked before the writes
    assert followed.result(10) == 3  # not 1: older than what this caller already had
    leader.shutdown()
    there.client.close()


def test_a_host_whose_clock_is_ahead_cannot_overwrite_a_newer_set(
    client: redis.Redis, namespace: str
) -> None:
    class Ahead:
        """A host whose wall clock runs 5 s ahead of the others'."""

        def time(self) -> float:
            return wall_clock() + 5

        def monotonic(self) -> float:
            return time.monotonic()

    wall_clock = time.time

    skewed = stampede.Stampede(client, namespace=namespace, clock=Ahead(), lease_ttl=0.1)
    honest = stampede.Stampede(client, namespace=namespace)
    read = skewed.read("k")  # the skewed host takes the lease and rebuilds slowly
    assert read.lease is not None
    time.sleep(0.3)  # its lease lapses
    honest.set("k", "newer")  # another host writes a newer value
    assert skewed.commit(read.lease, "older", store_if_lapsed=True) is False
    entry = honest.get("k")
    assert entry is not None
    assert entry.value == "newer"


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_pipelined_writes_survive_scripts_flushed_under_them(own_url: str, flavour: str) -> None:
    redis_url, namespace = own_url, "flushed"
    flusher_client = redis.Redis.from_url(redis_url)
    stop = threading.Event()

    def flush_scripts() -> None:
        # As a SCRIPT FLUSH, a restart or a failover would, now and then
        # between redis-py's SCRIPT LOAD and the pipeline's EVALSHAs.
        while not stop.wait(0.002):
            flusher_client.script_flush()

    flusher = threading.Thread(target=flush_scripts, daemon=True)
    flusher.start()
    mapping = {f"k{i}": i for i in range(20)}
    try:
        if flavour == "sync":
            sf = stampede.Stampede(redis.Redis.from_url(redis_url, socket_timeout=5), namespace=namespace)
            for _ in range(150):
                sf.set_many(mapping)
                assert sf.delete_many(list(mapping)) == len(mapping)
            sf.client.close()
        else:

            async def writes() -> None:
                client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=5)
                asf = stampede.asyncio.Stampede(client, namespace=namespace)
                for _ in range(150):
                    await asf.set_many(mapping)
                    assert await asf.delete_many(list(mapping)) == len(mapping)
                await client.aclose()

            asyncio.run(writes())
    finally:
        stop.set()
        flusher.join(5)
        flusher_client.close()


def test_a_lost_subscriber_connection_wakes_the_waiters_who_then_get_the_value(
    sf: stampede.Stampede, client: redis.Redis
) -> None:
    holder = stampede.Stampede(client, namespace=sf.namespace)
    read = holder.read("k")
    assert read.lease is not None
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(sf.read("k", wait_timeout=30)))
    waiter.start()
    channel = sf._keys("k").channel
    deadline = time.monotonic() + 10
    while client.pubsub_numsub(channel)[0][1] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # Cut the subscriber's connection; the value lands while it is gone.
    client.client_kill_filter(_type="pubsub")
    holder.commit(read.lease, "landed")
    waiter.join(30)
    assert got == [stampede.Read(True, "landed")]
