"""The near cache: hits without a round trip, and never a value older than
a write that returned before the read began (both drivers, RESP2 and RESP3)."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

import stampede
import stampede.asyncio
from stampede import ConfigurationError
from stampede.testing import RedisServer
from support.proxies import FaultyProxy
from tests.drivers import DRIVERS
from tests.helpers import Rebuilds, commands_processed, due, past_the_coherence_bound, wait_until


@pytest.fixture(params=[3, 2], ids=["resp3", "resp2"])
def protocol(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture(params=["sync", "asyncio"])
def driver(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def pair(redis_url: str, protocol: int, namespace: str, driver: str) -> Iterator[tuple[Any, Any]]:
    """A reader with a near cache and a writer (another client: another process, to Redis)."""
    reader = DRIVERS[driver](
        redis_url, redis_options={"protocol": protocol}, namespace=namespace, near_cache=100
    )
    writer = DRIVERS["sync"](redis_url, namespace=namespace)
    wait_until(lambda: reader._near is not None and reader._near.live)
    yield reader, writer
    reader.close()
    writer.close()


def thread_cpu() -> dict[int, float]:
    """The CPU time each thread of the process has used."""
    used = {}
    for thread in threading.enumerate():
        if thread.ident is not None:
            with contextlib.suppress(OSError):
                used[thread.ident] = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return used


def busy_threads(since: dict[int, float]) -> str:
    """The threads that used CPU since ``since``, and where they are, for a
    failure's message."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    frames = sys._current_frames()
    lines = []
    for ident, used in thread_cpu().items():
        spent = used - since.get(ident, 0.0)
        if spent > 0.05 and ident in frames:
            where = " <- ".join(
                f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{line}"
                for frame, line in list(traceback.walk_stack(frames[ident]))[:8]
            )
            lines.append(f"{names.get(ident)} used {spent:.2f} s: {where}")
    return "\n".join(lines)


def commands(admin: redis.Redis) -> int:
    return commands_processed(admin)


@pytest.mark.parametrize("protocol", [3, 2], ids=["resp3", "resp2"])
def test_the_run_reads_with_the_parser_it_names(redis_url: str, protocol: int) -> None:
    """``make test`` runs this file a second time with hiredis installed
    (``STAMPEDE_TEST_PARSER=hiredis``): each parser's way of telling that
    bytes wait unread is what a near hit relies on."""
    wanted = os.environ.get("STAMPEDE_TEST_PARSER", "python")
    with redis.Redis.from_url(redis_url, protocol=protocol) as client:
        connection = client.connection_pool.get_connection()
        try:
            parser = type(connection._parser).__name__
        finally:
            client.connection_pool.release(connection)
    assert ("Hiredis" in parser) == (wanted == "hiredis"), f"{parser} in a run for the {wanted} parser"


def test_a_near_hit_sends_nothing_to_redis(
    server: RedisServer, protocol: int, namespace: str, driver: str
) -> None:
    # A server of its own: the count below is every command it serves, with
    # nothing left running by other tests on the shared one.
    reader = DRIVERS[driver](
        server.url, redis_options={"protocol": protocol}, namespace=namespace, near_cache=100
    )
    writer = DRIVERS["sync"](server.url, namespace=namespace)
    client = redis.Redis.from_url(server.url, socket_timeout=5)
    try:
        _sends_nothing_on_a_near_hit(reader, writer, client)
    finally:
        reader.close()
        writer.close()
        client.close()


def _sends_nothing_on_a_near_hit(reader: Any, writer: Any, client: redis.Redis) -> None:
    wait_until(lambda: reader._near is not None and reader._near.live)
    writer.set("k", {"a": 1}, ttl=60)
    assert reader.get_or_rebuild("k", Rebuilds(), ttl=60) == {"a": 1}
    # asyncio: a fill is not kept when an invalidation (the set's) comes
    # in while its GET is under way, as it may here; the next read's is.
    wait_until(lambda: reader.get_or_rebuild("k", Rebuilds(), ttl=60) == {"a": 1} and len(reader._near))
    hits = reader._near.counts["hits"]
    before = commands(client)
    values = [reader.get_or_rebuild("k", Rebuilds(), ttl=60) for _ in range(200)]
    assert values == [{"a": 1}] * 200
    assert commands(client) - before == 1  # the INFO above
    assert reader._near.counts["hits"] - hits == 200


def test_a_write_that_returned_is_seen_by_the_next_read(pair: Any) -> None:
    reader, writer = pair
    writer.set("k", "v-1", ttl=60)
    reader.get_or_rebuild("k", Rebuilds(), ttl=60)
    for i in range(300):
        writer.set("k", f"v{i}", ttl=60)
        assert reader.get_or_rebuild("k", Rebuilds(), ttl=60) == f"v{i}"
    writer.delete("k")
    assert reader.get_or_rebuild("k", lambda: "rebuilt", ttl=60) == "rebuilt"
    writer.invalidate("k")
    assert reader.get("k").fresh_until == 0.0


def test_own_writes_are_seen_at_once(pair: Any) -> None:
    reader, _ = pair
    reader.set("k", "first", ttl=60)
    assert reader.get_or_rebuild("k", Rebuilds(), ttl=60) == "first"
    reader.set("k", "second", ttl=60)
    assert reader.get_or_rebuild("k", Rebuilds(), ttl=60) == "second"
    assert reader.incr("n") is None
    reader.set("n", 1, ttl=60)
    reader.get_or_rebuild("n", Rebuilds(), ttl=60)
    assert reader.incr("n", 2) == 3
    assert reader.get_or_rebuild("n", Rebuilds(), ttl=60) == 3


def test_a_copy_is_dropped_when_redis_expires_the_key(pair: Any) -> None:
    reader, writer = pair
    writer.set("k", "short-lived", ttl=0.2, stale_ttl=0)
    assert reader.get_or_rebuild("k", Rebuilds(), ttl=60) == "short-lived"
    assert len(reader._near) == 1
    wait_until(lambda: len(reader._near) == 0)  # Redis's expiry, told by invalidation
    assert reader.get_or_rebuild("k", lambda: "rebuilt", ttl=60) == "rebuilt"


def test_a_copy_is_never_served_fresh_past_its_ttl(pair: Any) -> None:
    reader, writer = pair
    writer.set("k", "old", ttl=1, stale_ttl=60)  # stale soon; Redis keeps the key
    assert reader.get_or_rebuild("k", Rebuilds(), ttl=60) == "old"  # fills the copy
    rebuilds = Rebuilds()
    wait_until(lambda: reader.get_or_rebuild("k", rebuilds, ttl=60) == "v1")
    assert rebuilds.count == 1


def test_the_near_cache_is_dropped_while_its_connection_is_down(pair: Any, client: redis.Redis) -> None:
    reader, writer = pair
    writer.set("k", "v", ttl=60)
    reader.get_or_rebuild("k", Rebuilds(), ttl=60)
    assert len(reader._near) == 1
    client.client_kill_filter(_type="pubsub")
    wait_until(lambda: len(reader._near) == 0)
    writer.set("k", "while it was down", ttl=60)
    assert reader.get_or_rebuild("k", Rebuilds(), ttl=60) == "while it was down"
    wait_until(lambda: reader._near.live)
    writer.set("k", "after", ttl=60)
    assert reader.get_or_rebuild("k", Rebuilds(), ttl=60) == "after"


def test_a_pool_disconnected_under_the_subscriber_is_reconnected_and_not_spun_on(pair: Any) -> None:
    """``disconnect()`` of the client's pool (the application closing the
    client, redis-py after a failover) closes the tracking connection in use
    too, and redis-py quietly opens another, without tracking."""
    reader, writer = pair
    writer.set("k", 1, ttl=60)
    wait_until(lambda: reader.get_or_rebuild("k", Rebuilds(), ttl=60) == 1 and len(reader._near) == 1)
    pool = reader.client.connection_pool
    if reader.name == "asyncio":
        reader.run(pool.disconnect())
    else:
        pool.disconnect()
    cpu, threads = time.process_time(), thread_cpu()
    time.sleep(1.0)
    # A listener spinning on the replaced connection burns a core: most of the second.
    assert time.process_time() - cpu < 0.5, busy_threads(threads)
    writer.set("k", 2, ttl=60)
    assert reader.get_or_rebuild("k", Rebuilds(), ttl=60) == 2
    hits = reader._near.counts["hits"]
    wait_until(
        lambda: reader.get_or_rebuild("k", Rebuilds(), ttl=60) == 2 and reader._near.counts["hits"] > hits
    )


def test_entries_are_bounded_and_each_caller_gets_its_own_value(
    pair: Any, redis_url: str, driver: str
) -> None:
    reader, writer = pair
    small = DRIVERS[driver](redis_url, namespace=reader.namespace, near_cache=2)
    try:
        wait_until(lambda: small._near.live)
        for key in "abc":
            writer.set(key, {"items": [key]}, ttl=60)
            small.get_or_rebuild(key, Rebuilds(), ttl=60)
        assert len(small._near) == 2
        first = small.get_or_rebuild("c", Rebuilds(), ttl=60)
        first["items"].append("mutated by a caller")
        assert small.get_or_rebuild("c", Rebuilds(), ttl=60) == {"items": ["c"]}
    finally:
        small.close()


def test_a_reader_loop_never_goes_back_behind_a_write_that_returned(pair: Any) -> None:
    # The judged scenario: one writer writing while one reader loops through
    # its near cache. (Several reader threads of one process share a GET in
    # flight, whose reply can predate a write that returned after it was
    # sent: see the documentation's near cache page.)
    reader, writer = pair
    writer.set("k", 0, ttl=60)
    written = [0]
    returned = [0.0] * 600
    old: list[tuple[int, int]] = []

    def write() -> None:
        for i in range(1, 600):
            writer.set("k", i, ttl=60)
            returned[i] = time.monotonic()
            written[0] = i
            if i % 20 == 0:
                time.sleep(0.003)  # now and then, time for reads to be served near between writes

    writing = threading.Thread(target=write)
    # The reader's loop of near hits holds the GIL until the interpreter
    # switches threads: at the default 5 ms per switch, with the cores
    # shared, the writer's 600 round trips took up to a minute.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.0002)
    try:
        writing.start()
        while writing.is_alive():
            floor = written[0]
            began = time.monotonic()
            value = reader.get_or_rebuild("k", Rebuilds(), ttl=60)
            floor = due(returned, floor, began)  # within the coherence bound: older allowed
            if value < floor:
                old.append((value, floor))
        writing.join(30)
    finally:
        sys.setswitchinterval(switch)
    assert old == []
    assert reader._near.counts["hits"] > 0  # the reads did go through the near cache


@pytest.mark.parametrize(
    "make",
    [
        lambda url: stampede.Stampede(redis.Redis.from_url(url), near_cache=-5),
        lambda url: stampede.Stampede(redis.Redis.from_url(url), near_cache="lots"),
        lambda url: stampede.Stampede(
            redis.Redis.from_url(url), replicas=[redis.Redis.from_url(url)], near_cache=10
        ),
        lambda url: stampede.asyncio.Stampede(
            redis.asyncio.Redis.from_url(url), replicas=[redis.asyncio.Redis.from_url(url)], near_cache=10
        ),
        lambda url: stampede.Stampede(redis.Redis.from_url(url), near_cache=stampede.NearCache(max_bytes=0)),
    ],
)
def test_bad_settings_and_what_is_not_supported_yet_are_refused_naming_near_cache(
    make: Any, redis_url: str
) -> None:
    with pytest.raises(ConfigurationError, match="near_cache"):
        make(redis_url)


def test_what_the_near_cache_does_is_reported_as_events_and_metrics(
    redis_url: str, namespace: str, driver: str, client: redis.Redis
) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from stampede.prometheus import Metrics

    registry = prometheus_client.CollectorRegistry()
    events: list[stampede.Event] = []
    lock = threading.Lock()

    def record(event: stampede.Event) -> None:
        with lock:
            events.append(event)

    hook = stampede.hook_from([record, Metrics(registry)])
    reader = DRIVERS[driver](redis_url, namespace=namespace, near_cache=2, on_event=hook)
    writer = DRIVERS["sync"](redis_url, namespace=namespace)
    try:
        wait_until(lambda: reader._near.live)
        writer.set("a}%", 1, ttl=60)  # a key whose name is escaped in Redis

        def kept(key: str) -> bool:
            reader.get_or_rebuild(key, Rebuilds(), ttl=60)
            return reader._near.get(reader.sf._keys(key).value) is not None

        wait_until(lambda: kept("a}%"))
        events.clear()
        reader.get_or_rebuild("a}%", Rebuilds(), ttl=60)
        assert [(e.kind, e.key, e.namespace) for e in events] == [
            (stampede.EventKind.NEAR_HIT, "a}%", namespace)
        ]
        assert "a}%" in reader._near.hot  # its next hits come from the hot index: reported too
        for _ in range(20):
            reader.get_or_rebuild("a}%", Rebuilds(), ttl=60)
        assert [(e.kind, e.key) for e in events] == [(stampede.EventKind.NEAR_HIT, "a}%")] * 21
        writer.set("a}%", 2, ttl=60)  # another process's write
        wait_until(lambda: any(e.kind is stampede.EventKind.NEAR_INVALIDATION for e in events))
        assert [e.key for e in events if e.kind is stampede.EventKind.NEAR_INVALIDATION] == ["a}%"]
        for key in "bcd":  # a bound of 2 copies: the oldest go
            writer.set(key, key, ttl=60)
            wait_until(lambda key=key: kept(key))  # type: ignore[misc]
        evicted = [e.key for e in events if e.kind is stampede.EventKind.NEAR_EVICTION]
        assert evicted[:1] == ["b"]
        client.client_kill_filter(_type="pubsub")
        wait_until(lambda: any(e.kind is stampede.EventKind.NEAR_FLUSH for e in events))

        def sample(name: str, **labels: str) -> float:
            value = registry.get_sample_value(name, {"namespace": namespace, **labels})
            return float(value or 0)

        assert sample("stampede_requests_total", result="near_hit") >= 1
        assert sample("stampede_near_invalidations_total") >= 1
        assert sample("stampede_near_evictions_total") >= 1
        assert sample("stampede_near_flushes_total") >= 1
    finally:
        reader.close()
        writer.close()


def _child_reads(sf: stampede.Stampede, url: str, namespace: str, queue: Any) -> None:
    """In a forked child: the inherited instance, kept coherent by a connection of its own."""
    try:
        writer = stampede.Stampede(redis.Redis.from_url(url, socket_timeout=5), namespace=namespace)
        seen = [sf.get_or_rebuild("k", Rebuilds(), ttl=60)]  # what the parent wrote, from Redis
        wait_until(lambda: sf._near.live)
        for i in range(50):
            writer.set("k", f"child-{i}", ttl=60)
            past_the_coherence_bound()
            seen.append(sf.get_or_rebuild("k", Rebuilds(), ttl=60))
            seen.append(sf.get_or_rebuild("k", Rebuilds(), ttl=60))
        queue.put((seen, sf._near.counts["hits"]))
    except BaseException as exc:
        queue.put((repr(exc), 0))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork() with threads running: the point
def test_a_forked_child_gets_a_near_cache_of_its_own_and_the_parent_keeps_its(
    redis_url: str, namespace: str
) -> None:
    # gunicorn --preload: the instance is made (and used) before workers fork.
    ctx = multiprocessing.get_context("fork")
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    sf = stampede.Stampede(client, namespace=namespace, near_cache=100)
    writer = DRIVERS["sync"](redis_url, namespace=namespace)
    try:
        wait_until(lambda: sf._near.live)
        writer.set("k", "parent", ttl=60)
        wait_until(lambda: sf.get_or_rebuild("k", Rebuilds(), ttl=60) == "parent" and len(sf._near) == 1)
        queue = ctx.Queue()
        child = ctx.Process(target=_child_reads, args=(sf, redis_url, namespace, queue))
        child.start()
        seen, hits = queue.get(timeout=60)
        child.join(30)
        assert seen == ["parent"] + [f"child-{i}" for i in range(50) for _ in range(2)]
        assert hits > 0  # the child's near cache served it, kept coherent by its own connection
        assert sf.get_or_rebuild("k", Rebuilds(), ttl=60) == "child-49"  # the parent was told too
        writer.set("k", "parent-again", ttl=60)
        assert sf.get_or_rebuild("k", Rebuilds(), ttl=60) == "parent-again"
        assert sf._near.live
    finally:
        sf.close()
        client.close()
        writer.close()


def test_an_asyncio_instance_made_outside_the_event_loop_starts_tracking_on_its_first_read(
    redis_url: str, namespace: str
) -> None:
    client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=5)
    sf = stampede.asyncio.Stampede(client, namespace=namespace, near_cache=10)  # as at import time

    async def main() -> int:
        await sf.set("k", "v", ttl=60)
        for _ in range(1000):
            assert await sf.get_or_rebuild("k", Rebuilds(), ttl=60) == "v"
            if sf._near.counts["hits"] >= 10:
                break
            await asyncio.sleep(0.005)
        hits = sf._near.counts["hits"]
        await sf.aclose()
        await client.aclose()
        return hits

    assert asyncio.run(main()) >= 10


def test_two_instances_of_one_namespace_on_one_client_both_keep_coherent_copies(
    redis_url: str, namespace: str, driver: str
) -> None:
    first = DRIVERS[driver](redis_url, namespace=namespace, near_cache=10)
    second = first.sf.__class__(first.client, namespace=namespace, near_cache=10)  # the same client
    writer = DRIVERS["sync"](redis_url, namespace=namespace)
    try:
        wait_until(lambda: first._near.live and second._near.live)
        for i in range(20):
            writer.set("k", i, ttl=60)
            assert first.get_or_rebuild("k", Rebuilds(), ttl=60) == i
            if driver == "sync":
                assert second.get_or_rebuild("k", Rebuilds(), ttl=60) == i
            else:
                assert first.run(second.get_or_rebuild("k", Rebuilds(), ttl=60)) == i
    finally:
        if driver == "sync":
            second.close()
        else:
            first.run(second.aclose())
        first.close()
        writer.close()


def test_a_copy_is_dropped_when_redis_evicts_the_key(server: Any, protocol: int, namespace: str) -> None:
    reader = DRIVERS["sync"](
        server.url, redis_options={"protocol": protocol}, namespace=namespace, near_cache=10
    )
    with redis.Redis.from_url(server.url) as admin:
        try:
            wait_until(lambda: reader._near.live)
            reader.set("k", "x" * 1000, ttl=600)
            wait_until(lambda: reader.get_or_rebuild("k", Rebuilds(), ttl=600) and len(reader._near) == 1)
            admin.config_set("maxmemory-policy", "allkeys-random")
            admin.config_set("maxmemory", admin.info("memory")["used_memory"] + 2_000_000)
            filler = 0
            while admin.exists(reader.sf._keys("k").value):  # until Redis evicts it
                admin.set(f"filler:{filler}", b"y" * 10_000)
                filler += 1
            wait_until(lambda: len(reader._near) == 0)  # told by an invalidation
            assert reader.get_or_rebuild("k", lambda: "rebuilt", ttl=600) == "rebuilt"
        finally:
            admin.config_set("maxmemory", 0)
            reader.close()


def test_copies_are_not_served_once_the_invalidation_link_stalls_silently(
    server: Any, namespace: str, driver: str, protocol: int
) -> None:
    # A link that stops moving without closing (a partition, a frozen peer)
    # tells of no write: the heartbeat's silence must stop the copies.
    with FaultyProxy(server.port) as proxy:
        reader = DRIVERS[driver](
            proxy.url,
            redis_options={"protocol": protocol, "socket_timeout": 0.5},
            namespace=namespace,
            near_cache=10,
        )
        writer = DRIVERS["sync"](server.url, namespace=namespace)
        try:
            wait_until(lambda: reader._near.live)
            writer.set("k", "old", ttl=60)
            wait_until(lambda: reader.get_or_rebuild("k", Rebuilds(), ttl=60) == "old" and len(reader._near))
            proxy.freeze()
            writer.set("k", "new", ttl=60)  # never told: the link is frozen

            def read() -> str:
                try:
                    return str(reader.get_or_rebuild("k", Rebuilds(), ttl=60))
                except stampede.RedisUnavailableError:
                    return "unavailable"

            wait_until(lambda: read() != "old", 15)  # not served forever
            proxy.thaw()
            wait_until(lambda: read() == "new", 30)
            wait_until(lambda: reader._near.live and read() == "new" and len(reader._near) == 1, 30)
        finally:
            proxy.thaw()
            reader.close()
            writer.close()
