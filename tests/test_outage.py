"""Redis away, slow, full or refusing, for real (a redis-server stopped,
frozen with SIGSTOP, at its maxmemory, busy with a script, a replica, at its
client limit): what every call answers under ``fail_open``, what it raises
without, the circuit breaker, and the removals owed across an outage."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

import stampede
from stampede import RedisUnavailableError
from stampede._core import owed
from stampede._core.keys import KeySpace
from stampede.testing import RedisServer
from tests.helpers import Rebuilds, wait_until

pytestmark = pytest.mark.slow


class Recorder:
    """An ``on_event`` hook that keeps every event (thread-safe)."""

    def __init__(self) -> None:
        self.events: list[stampede.Event] = []
        self._lock = threading.Lock()

    def __call__(self, event: stampede.Event) -> None:
        with self._lock:
            self.events.append(event)

    def of(self, kind: stampede.EventKind) -> list[stampede.Event]:
        with self._lock:
            return [event for event in self.events if event.kind is kind]


def _quick(make_driver: Any, url: str, **kwargs: Any) -> Any:
    """A driver whose connections give up after half a second."""
    options = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}
    return make_driver(url, redis_options=options, **kwargs)


#: Every plain call and what it answers under fail_open with Redis away: what
#: it would answer on an empty cache that stores nothing.
PLAIN_CALLS: list[tuple[str, Any, Any]] = [
    ("get", lambda sf: sf.get("k"), None),
    ("get_many", lambda sf: sf.get_many(["k", "j"]), {}),
    ("has_key", lambda sf: sf.has_key("k"), False),
    ("set", lambda sf: sf.set("k", 1, tags=["t"]), None),
    ("set_many", lambda sf: sf.set_many({"k": 1, "j": 2}), None),
    ("add", lambda sf: sf.add("new", 1), True),
    ("touch", lambda sf: sf.touch("k", ttl=60), False),
    ("incr", lambda sf: sf.incr("n"), None),
    ("delete", lambda sf: sf.delete("k"), False),
    ("delete_many", lambda sf: sf.delete_many(["k", "j"]), 0),
    ("invalidate", lambda sf: sf.invalidate("k"), False),
    ("invalidate_tags", lambda sf: sf.invalidate_tags("t"), None),
    ("delete_tags", lambda sf: sf.delete_tags("t"), None),
    ("invalidate_all", lambda sf: sf.invalidate_all(), None),
    ("delete_prefix", lambda sf: sf.delete_prefix("k"), 0),
    ("clear", lambda sf: sf.clear(), 0),
    ("get_or_rebuild", lambda sf: sf.get_or_rebuild("k", lambda: "rebuilt"), "rebuilt"),
    (
        "get_or_rebuild_many",
        lambda sf: sf.get_or_rebuild_many(["k"], lambda ks: {k: 7 for k in ks}),
        {"k": 7},
    ),
]


@pytest.mark.parametrize("make_driver", ["sync", "asyncio"], indirect=True)
def test_with_fail_open_every_call_answers_while_redis_is_stopped(
    make_driver: Any, server: RedisServer
) -> None:
    sf = _quick(make_driver, server.url, fail_open=True)
    sf.set("k", 0)
    server.stop()
    try:
        for name, call, expected in PLAIN_CALLS:
            assert call(sf) == expected, name
        read = sf.read("never-read")  # a miss; its lease is of this process alone
        assert read.found is False
        assert read.lease is not None
        sf.release(read.lease)
    finally:
        server.start()


@pytest.mark.parametrize("make_driver", ["sync", "asyncio"], indirect=True)
def test_without_fail_open_every_call_raises_redis_unavailable(make_driver: Any, server: RedisServer) -> None:
    sf = _quick(make_driver, server.url)
    server.stop()
    try:
        for name, call, _ in PLAIN_CALLS:
            with pytest.raises(RedisUnavailableError) as raised:
                call(sf)
            assert raised.value.code in ("CONNECTION", "TIMEOUT"), name
    finally:
        server.start()


@pytest.mark.parametrize("make_driver", ["sync", "asyncio"], indirect=True)
def test_a_redis_that_stopped_answering_costs_one_socket_timeout_then_nothing(
    make_driver: Any, server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    # Frozen (SIGSTOP): connections are accepted by the kernel but nothing is
    # answered, as behind a firewall that drops packets: each command that is
    # sent waits out the socket timeout.
    caplog.set_level(logging.DEBUG, logger="stampede")
    recorder = Recorder()
    sf = _quick(make_driver, server.url, fail_open=True, on_event=recorder)
    sf.set("k", 0)
    server.pause()
    try:
        values = [sf.get_or_rebuild(f"key{i}", lambda: "rebuilt") for i in range(30)]
        # Calls go on while the breaker's probes, sent beside them, fail one
        # after another, each waiting out a socket timeout of its own.
        wait_until(
            lambda: sf.get_or_rebuild("key0", lambda: "rebuilt") == "rebuilt" and _probes_failed(caplog) >= 2
        )
        errors = [event.error for event in recorder.of(stampede.EventKind.REDIS_ERROR)]
    finally:
        server.resume()
    assert values == ["rebuilt"] * 30
    # The first call waited for Redis; every call after it skipped Redis,
    # however many pauses ended meanwhile: no caller sends the probe.
    sent = [error for error in errors if "not sent" not in str(error)]
    assert len(sent) == 1, sent
    assert len(recorder.of(stampede.EventKind.REDIS_DOWN)) == 1
    # It answers again: the next probe closes the breaker.
    wait_until(lambda: sf.get_or_rebuild("k", Rebuilds()) == 0)
    assert len(recorder.of(stampede.EventKind.REDIS_UP)) == 1


def _probes_failed(caplog: pytest.LogCaptureFixture) -> int:
    return sum(1 for record in caplog.records if record.getMessage().startswith("Redis probe failed"))


@pytest.mark.parametrize("make_driver", ["sync", "asyncio"], indirect=True)
def test_removals_made_while_redis_is_away_are_sent_when_it_answers(
    make_driver: Any, server: RedisServer
) -> None:
    sf = _quick(make_driver, server.url, fail_open=True)
    other = make_driver(server.url)  # another process, to Redis
    sf.set("written", "old", ttl=600)
    sf.set("deleted", "old", ttl=600)
    sf.set("invalidated", "old", ttl=600)
    sf.set("tagged", "old", ttl=600, tags=["t"])
    sf.set("gone", "old", ttl=600, tags=["g"])
    server.pause()
    try:
        sf.set("written", "new")  # not stored: its older value is owed an invalidation
        assert sf.delete("deleted") is False
        assert sf.invalidate("invalidated") is False
        sf.invalidate_tags("t")
        sf.delete_tags("g")
    finally:
        server.resume()

    # Nothing more is asked of the instance: it sends them in the background,
    # in order, one round trip each (so all of them are waited for, not the first).
    def all_sent() -> bool:
        written, invalidated, tagged = other.get("written"), other.get("invalidated"), other.get("tagged")
        return (
            written is not None
            and not written.is_fresh()
            and other.get("deleted") is None
            and invalidated is not None
            and not invalidated.is_fresh()
            and tagged is not None
            and not tagged.is_fresh()
            and other.get("gone") is None
        )

    wait_until(all_sent, timeout=15)


@pytest.mark.parametrize("make_driver", ["sync", "asyncio"], indirect=True)
def test_a_removal_sent_late_reaches_only_what_was_written_before_it_was_asked(
    make_driver: Any, server: RedisServer
) -> None:
    # This process loses Redis (a link that drops everything) while another
    # still reaches it: what the other writes after this one's delete was
    # asked is newer than the delete, and stays when the delete is sent at
    # last; a rebuild whose lease was won before the delete stores nothing.
    from support.proxies import FaultyProxy

    other = make_driver(server.url)
    with FaultyProxy(server.port) as proxy:
        sf = _quick(make_driver, proxy.url, fail_open=True)
        sf.set("k", "old", ttl=600)
        sf.set("r", "old", ttl=1, stale_ttl=600)
        wait_until(lambda: not other.get("r").is_fresh())
        rebuilding = other.read("r")  # a rebuild begins: its lease is won now
        assert rebuilding.lease is not None
        proxy.freeze()
        sf.delete("k")
        sf.delete("r")
        proxy.cut()  # the deletes sent into the frozen link never reach Redis
        assert other.get("k").value == "old"
        time.sleep(owed.CLOCK_LEEWAY + 0.1)  # past the time the deletes are sent as of
        other.set("k", "newer", ttl=600)
        proxy.heal()
        wait_until(lambda: not sf._owed.pending, timeout=15)
        newer = other.get("k")
        assert (newer.value, newer.is_fresh()) == ("newer", True)
        assert other.commit(rebuilding.lease, "rebuilt from what was deleted") is False
        assert other.get("r") is None


@pytest.mark.parametrize("make_driver", ["sync", "asyncio"], indirect=True)
def test_a_read_after_redis_answers_again_never_serves_what_this_process_removed(
    make_driver: Any, server: RedisServer
) -> None:
    sf = _quick(make_driver, server.url, fail_open=True)
    sf.set("k", "old", ttl=600)
    server.pause()
    try:
        sf.delete("k")
    finally:
        server.resume()
    # The first call after Redis answers sends what is owed before its own read.
    assert sf.get_or_rebuild("k", lambda: "new") == "new"


@pytest.mark.parametrize("make_driver", ["sync", "asyncio"], indirect=True)
def test_a_full_redis_serves_reads_and_rebuilds_without_the_lease(
    make_driver: Any, server: RedisServer
) -> None:
    sf = make_driver(server.url)  # no fail_open: a read must not fail for a write
    sf.set("there", "v", ttl=600)
    admin = redis.Redis.from_url(server.url)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)
    try:
        assert sf.get_or_rebuild("there", Rebuilds()) == "v"
        assert sf.get_or_rebuild("missing", lambda: "rebuilt") == "rebuilt"
        assert sf.get_or_rebuild_many(["missing"], lambda ks: {k: "r" for k in ks}) == {"missing": "r"}
        assert sf.get("missing") is None  # rebuilt without the lease: not stored
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()


@pytest.mark.parametrize("make_driver", ["sync", "asyncio"], indirect=True)
def test_a_value_rendered_under_a_lease_of_the_process_alone_is_stored_nowhere(
    make_driver: Any, server: RedisServer
) -> None:
    # Redis full refuses the lease: a Django get's caller renders under a lease
    # of its process alone. A delete by another process meanwhile (its data
    # changed) reaches Redis; the render, which may have read the data before,
    # must not land after it, and nothing in Redis could refuse it.
    sf, other = make_driver(server.url), make_driver(server.url)
    admin = redis.Redis.from_url(server.url)
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)
    try:
        read = sf.read("page")
        assert read.lease is not None
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()
    other.delete("page")
    assert sf.commit(read.lease, "rendered before the delete") is False
    assert other.get("page") is None
    assert sf.get("page") is None  # nor kept in the process: Redis answers


def test_a_database_out_of_range_is_a_misconfiguration_even_with_fail_open(server: RedisServer) -> None:
    sf = stampede.Stampede.from_url(urlunsplit(urlsplit(server.url)._replace(path="/99")), fail_open=True)
    with pytest.raises(stampede.ConfigurationError, match="no such database"):
        sf.get_or_rebuild("k", lambda: 1)
    sf.close()


@pytest.mark.parametrize("make_driver", ["sync", "asyncio"], indirect=True)
def test_while_redis_is_away_one_reader_per_process_rebuilds_and_the_others_wait_for_it(
    make_driver: Any, server: RedisServer
) -> None:
    # A Django get (or the cache middleware's) then the view's set: the first
    # reader of a key renders it; those of its process that come meanwhile
    # are served its set, not a render each.
    sf = _quick(make_driver, server.url, fail_open=True)
    server.stop()
    try:
        first = sf.read("page")
        assert (first.found, first.lease is not None) == (False, True)
        results: list[Any] = []
        lock = threading.Lock()

        def read() -> None:
            found = sf.read("page")
            with lock:
                results.append((found.found, found.value, found.lease))

        readers = [threading.Thread(target=read) for _ in range(8)]
        for reader in readers:
            reader.start()
        wait_until(lambda: sf._calls.flights.followers() >= 8)
        assert sf.commit(first.lease, "rendered") is False  # not stored: Redis is away
        for reader in readers:
            reader.join(10)
        assert results == [(True, "rendered", None)] * 8
        # Kept in the process for its ttl while Redis is away: served again,
        # not rendered again; a delete of this process drops it.
        assert sf.read("page").value == "rendered"
        sf.delete("page")
        again = sf.read("page")
        assert (again.found, again.lease is not None) == (False, True)
        sf.release(again.lease)
    finally:
        server.start()


@pytest.mark.parametrize("make_driver", ["sync", "asyncio"], indirect=True)
def test_a_value_over_the_servers_limit_is_refused_by_name_and_still_returned(
    make_driver: Any, server: RedisServer
) -> None:
    admin = redis.Redis.from_url(server.url)
    admin.config_set("proto-max-bulk-len", 2 * 1024 * 1024)  # the least Redis takes: 1 MB
    sf = make_driver(server.url, compress_above=None)
    big = "x" * (3 * 1024 * 1024)
    received = admin.info("stats")["total_net_input_bytes"]
    with pytest.raises(RedisUnavailableError, match=r"at most 2097152 bytes.*key 'big'") as raised:
        sf.set("big", big)
    assert raised.value.code == "TOO_LARGE"
    assert sf.get_or_rebuild("big", lambda: big) == big  # rebuilt, not stored, and returned
    # Never sent: Redis would have closed the connection, and redis-py sent it again.
    assert admin.info("stats")["total_net_input_bytes"] - received < len(big)
    admin.close()


def test_once_redis_answers_again_nothing_is_rebuilt_beside_it(server: RedisServer) -> None:
    # Threads call 20 stored keys in turn while Redis stops answering (frozen,
    # it keeps them): each key is rebuilt once without Redis and kept. Once
    # it answers again, Redis's values are served: nothing is rebuilt. The
    # callers the breaker turned away just before its probe was answered are
    # served what was kept, not a rebuild of their own.
    sf = stampede.Stampede.from_url(
        server.url, fail_open=True, socket_timeout=0.5, socket_connect_timeout=0.5
    )
    names = [f"k{i}" for i in range(20)]
    rebuilds: dict[str, Rebuilds] = {name: Rebuilds(lambda n: "v", delay=0.01) for name in names}
    stop = threading.Event()
    errors: list[BaseException] = []

    def call(first: int) -> None:
        turn = first
        while not stop.is_set():
            name = names[turn % len(names)]
            turn += 1
            try:
                sf.get_or_rebuild(name, rebuilds[name], ttl=600)
            except BaseException as exc:
                errors.append(exc)

    for name in names:  # stored before the crowd comes
        sf.get_or_rebuild(name, rebuilds[name], ttl=600)
    threads = [threading.Thread(target=call, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    try:
        server.pause()
        try:
            wait_until(lambda: all(rebuild.count >= 2 for rebuild in rebuilds.values()))  # rebuilt, kept
            before = {name: rebuild.count for name, rebuild in rebuilds.items()}
        finally:
            server.resume()
        wait_until(lambda: not sf._server.breaker.tripped)
        time.sleep(0.2)  # calls go on, through Redis: nothing is rebuilt
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        sf.close()
    assert errors == []
    assert {name: rebuild.count - before[name] for name, rebuild in rebuilds.items()} == dict.fromkeys(
        names, 0
    )


@pytest.mark.parametrize("make_driver", ["sync", "asyncio"], indirect=True)
def test_while_redis_is_away_a_process_rebuilds_a_key_once_per_ttl(
    make_driver: Any, server: RedisServer
) -> None:
    sf = _quick(make_driver, server.url, fail_open=True)
    server.stop()
    try:
        rebuild = Rebuilds()
        values = [sf.get_or_rebuild("k", rebuild, ttl=600) for _ in range(20)]
        assert values == ["v1"] * 20
        assert rebuild.count == 1
        sf.invalidate_tags("any")  # a removal whose keys this process cannot tell: it drops them all
        assert sf.get_or_rebuild("k", rebuild, ttl=600) == "v2"
    finally:
        server.start()
    # Redis answers again: once its breaker closes, what Redis holds is served,
    # not what was kept.
    wait_until(lambda: sf.get_or_rebuild("k", Rebuilds(lambda n: "from redis"), ttl=600) == "from redis")


@pytest.mark.parametrize("make_driver", ["sync", "asyncio"], indirect=True)
def test_while_redis_is_away_the_near_cache_serves_its_copies_within_their_stale_window(
    make_driver: Any, server: RedisServer, keys: KeySpace
) -> None:
    sf = _quick(make_driver, server.url, fail_open=True, near_cache=100)
    sf.set("fresh", "near fresh", ttl=600)
    sf.set("stale", "near stale", ttl=0.05, stale_ttl=600)
    sf.set("gone", "near gone", ttl=0.05, stale_ttl=0.05)
    sf.set("removed", "near removed", ttl=600)
    # Each write sends the tracking connection an invalidation of its key,
    # which drops a copy it finds (late, on a busy machine): every one of
    # them has arrived once a PING sent after the writes is answered.
    written = time.monotonic()
    wait_until(lambda: sf._near.tracked.heartbeat.confirmed > written)
    for key in ("fresh", "stale", "removed"):
        # Read back: each one a near copy.
        wait_until(lambda key=key: sf.get(key) is not None and sf._near.get(keys(key).value) is not None)
    sf.get("gone")  # a copy too, unless it expired first: rebuilt below either way
    server.stop()
    try:
        # The invalidation link is lost with Redis: the copies are held apart.
        wait_until(lambda: not sf._near.live)
        threading.Event().wait(0.15)  # "stale" is past its ttl, "gone" past ttl + stale_ttl
        rebuild = Rebuilds()
        assert sf.get_or_rebuild("fresh", rebuild, stale_ttl=600) == "near fresh"
        assert sf.get_or_rebuild("stale", rebuild, stale_ttl=600) == "near stale"
        assert sf.read("stale", stale_ttl=600).value == "near stale"
        assert rebuild.count == 0
        assert sf.get_or_rebuild("gone", rebuild, stale_ttl=0.05) == "v1"  # past its window: rebuilt
        sf.delete("removed")  # owed; this process sees it at once
        assert sf.get_or_rebuild("removed", rebuild) == "v2"
    finally:
        server.start()
    # Redis answers again (empty, restarted): what it holds is served, not the copies held apart.
    wait_until(lambda: sf.get_or_rebuild("fresh", Rebuilds(lambda n: "rebuilt")) == "rebuilt")
    assert sf._near.held_away(keys("fresh").value) is None


@pytest.mark.parametrize("make_driver", ["sync", "asyncio"], indirect=True)
def test_while_redis_is_away_readers_that_come_at_once_wait_for_the_one_that_renders(
    make_driver: Any, server: RedisServer
) -> None:
    # A crowd of Django gets at once, Redis away: one of them renders (it gets
    # the lease of the process alone) and sets; every other is served that.
    sf = _quick(make_driver, server.url, fail_open=True)
    server.stop()
    try:
        for round_ in range(5):
            results = _crowd_reading(sf, f"page{round_}", 16)
            assert sorted(results) == [(False, None, True)] + [(True, "rendered", False)] * 15
    finally:
        server.start()


def _crowd_reading(sf: Any, key: str, count: int) -> list[tuple[bool, Any, bool]]:
    """``count`` threads read ``key`` at once; the one given a lease renders and
    commits. What each read found, its value and whether it got the lease."""
    results: list[tuple[bool, Any, bool]] = []
    lock = threading.Lock()
    start = threading.Barrier(count)

    def read() -> None:
        start.wait()
        found = sf.read(key)
        if found.lease is not None:
            threading.Event().wait(0.05)  # the render
            sf.commit(found.lease, "rendered")
        with lock:
            results.append((found.found, found.value, found.lease is not None))

    readers = [threading.Thread(target=read) for _ in range(count)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(20)
    return results


# --- refusals the server answers ------------------------------------------------


@contextlib.contextmanager
def _busy(server: RedisServer) -> Iterator[None]:
    """``server`` running a script that loops (past a 100 ms limit, every other
    client is answered ``BUSY``), killed on the way out."""
    admin = redis.Redis.from_url(server.url)
    admin.config_set("lua-time-limit", 100)
    blocker = redis.Redis.from_url(server.url)
    looping = threading.Thread(target=lambda: _swallow(lambda: blocker.eval("while true do end", 0)))
    looping.start()
    wait_until(lambda: _answers_busy(server.url))
    try:
        yield
    finally:
        wait_until(lambda: _swallow(admin.script_kill) or not looping.is_alive())
        looping.join(10)
        blocker.close()
        admin.close()


def _swallow(call: Any) -> bool:
    try:
        call()
    except redis.exceptions.ResponseError:
        return False
    return True


def _answers_busy(url: str) -> bool:
    with redis.Redis.from_url(url) as probe:
        try:
            probe.get("probe")
        except redis.exceptions.ResponseError as exc:
            return "BUSY" in str(exc)
    return False


@pytest.mark.parametrize("make_driver", ["sync", "asyncio"], indirect=True)
def test_a_busy_server_is_an_error_named_busy_and_fail_open_goes_on_without_it(
    make_driver: Any, server: RedisServer
) -> None:
    strict = _quick(make_driver, server.url)
    lenient = _quick(make_driver, server.url, fail_open=True)
    strict.set("k", "stored", ttl=600)
    with _busy(server):
        with pytest.raises(RedisUnavailableError) as raised:
            strict.get("k")
        assert raised.value.code == "BUSY"
        assert lenient.get_or_rebuild("cold", lambda: "rebuilt") == "rebuilt"
        assert lenient.get("k") is None
    assert strict.get("k").value == "stored"


@pytest.mark.parametrize("make_driver", ["sync", "asyncio"], indirect=True)
def test_a_replica_refuses_writes_as_readonly_and_reads_go_on(make_driver: Any, server: RedisServer) -> None:
    with RedisServer(args=["--replicaof", "127.0.0.1", str(server.port)]) as replica:
        primary = redis.Redis.from_url(server.url)
        with redis.Redis.from_url(replica.url) as watched:
            wait_until(lambda: watched.info("replication").get("master_link_status") == "up")
        writer = make_driver(server.url)
        writer.set("k", "stored", ttl=600)
        strict = _quick(make_driver, replica.url)
        lenient = _quick(make_driver, replica.url, fail_open=True)
        wait_until(lambda: strict.get("k") is not None)
        assert strict.get("k").value == "stored"
        with pytest.raises(RedisUnavailableError) as raised:
            strict.set("k", "mine")
        assert raised.value.code == "READONLY"
        lenient.set("k", "mine")  # dropped: the replica holds what its primary wrote
        assert strict.get("k").value == "stored"
        assert lenient.get_or_rebuild("cold", lambda: "rebuilt") == "rebuilt"
        assert strict.get_or_rebuild("k", lambda: "rebuilt", ttl=600) == "stored"
        primary.close()


@pytest.mark.parametrize("make_driver", ["sync", "asyncio"], indirect=True)
def test_a_server_at_its_client_limit_is_an_error_named_maxclients(
    make_driver: Any, server: RedisServer
) -> None:
    admin = redis.Redis.from_url(server.url)
    admin.ping()
    strict = _quick(make_driver, server.url)
    lenient = _quick(make_driver, server.url, fail_open=True)
    admin.config_set("maxclients", 1)  # the admin's own connection is the one
    try:
        with pytest.raises(RedisUnavailableError) as raised:
            strict.get_or_rebuild("k", lambda: "rebuilt")
        assert raised.value.code == "MAXCLIENTS"
        assert lenient.get_or_rebuild("k", lambda: "rebuilt") == "rebuilt"
    finally:
        admin.config_set("maxclients", 10000)
        admin.close()
