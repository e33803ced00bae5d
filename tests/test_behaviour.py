"""What users rely on, against real Redis, for both the sync and asyncio drivers."""

from __future__ import annotations

import logging
import pickle
import struct
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from stampede import (
    Event,
    EventKind,
    JsonSerializer,
    PickleSerializer,
    RebuildFailedError,
    SerializationError,
    WaitTimeoutError,
)
from stampede._core.codec import encode
from stampede._core.envelope import KIND, SIGNED
from stampede._core.keys import KeySpace
from tests.helpers import Rebuilds, namespace_version, run_threads, wait_until

#: What a count of the commands a test sent leaves out: its own, and heartbeats.
_NOT_COUNTED = ("cmdstat_info", "cmdstat_config", "cmdstat_ping")


def test_miss_rebuilds_once_then_hits(make_driver: Any) -> None:
    sf = make_driver()
    rebuild = Rebuilds()
    assert sf.get_or_rebuild("k", rebuild, ttl=60) == "v1"
    assert sf.get_or_rebuild("k", rebuild, ttl=60) == "v1"
    assert rebuild.count == 1


def test_fresh_hit_is_a_single_get(make_driver: Any, server: Any, near_cache: int | None) -> None:
    # A long tag_check_interval: the namespace's state, read by the first
    # call, is not read again here (its GET rides with a hit's once lapsed).
    sf = make_driver(server.url, tag_check_interval=60)
    with redis.Redis.from_url(server.url) as admin:
        # The namespace's state made beforehand, as it is once anything was
        # stored: its making would drop this process's tracked copy of it, once.
        namespace_version(admin, sf.namespace)
        sf.get_or_rebuild("k", Rebuilds(), ttl=60)
        admin.config_resetstat()
        for _ in range(5):
            assert sf.get_or_rebuild("k", Rebuilds(), ttl=60) == "v1"
        stats = admin.info("commandstats")
    sent = {
        name: stat["calls"]
        for name, stat in stats.items()
        if name not in ("cmdstat_info", "cmdstat_config", "cmdstat_ping")
    }
    if near_cache is None:
        assert sent == {"cmdstat_get": 5}
    else:  # the first GET fills the near copy; the rest are served from it
        assert set(sent) <= {"cmdstat_get"}
        assert sent.get("cmdstat_get", 0) <= 1


def test_while_another_process_refreshes_a_stale_key_a_read_is_a_single_get(
    make_driver: Any, server: Any, near_cache: int | None
) -> None:
    # The other process holds the lease; this one learns it once, then serves
    # the stale value on one GET per call rather than a GET and a lease request.
    sf, other = make_driver(server.url, tag_check_interval=60), make_driver(server.url)
    with redis.Redis.from_url(server.url) as admin:
        namespace_version(admin, sf.namespace)  # made beforehand, as in the test above
    sf.set("k", "stale", ttl=60, stale_ttl=60)
    sf.invalidate("k")
    refreshing = other.read("k", ttl=60, lease_ttl=30)
    assert refreshing.lease is not None
    with redis.Redis.from_url(server.url) as admin:
        admin.config_resetstat()
        for _ in range(10):
            assert sf.get_or_rebuild("k", Rebuilds(), ttl=60, background=False) == "stale"
        stats = admin.info("commandstats")
    sent = {
        name: stat["calls"]
        for name, stat in stats.items()
        if name not in ("cmdstat_info", "cmdstat_config", "cmdstat_ping")
    }
    # One lease request (EVALSHA, which GETs the lease inside) at most per
    # BUSY_MEMO_SECONDS; the calls take far less.
    scripts = sent.get("cmdstat_evalsha", 0)
    assert scripts <= 2, sent
    if near_cache is None:
        assert sent["cmdstat_get"] - scripts == 10, sent
    else:  # the stale value is served from the process: read once, to fill the copy
        assert sent.get("cmdstat_get", 0) - scripts <= 1, sent
    other.commit(refreshing.lease, "fresh")
    assert sf.get_or_rebuild("k", Rebuilds(), ttl=60) == "fresh"


def test_stored_with_hard_expiry_of_ttl_plus_stale_ttl(
    make_driver: Any, client: redis.Redis, keys: KeySpace
) -> None:
    sf = make_driver()
    sf.get_or_rebuild("k", Rebuilds(), ttl=60, stale_ttl=600)
    assert 659_000 < client.pttl(keys("k").value) <= 660_000
    sf.get_or_rebuild("forever", Rebuilds(), ttl=None)
    assert client.pttl(keys("forever").value) == -1


def test_cold_key_many_callers_one_rebuild(make_driver: Any) -> None:
    sf = make_driver()
    rebuild = Rebuilds(delay=0.2)
    results = run_threads(32, lambda: sf.get_or_rebuild("cold", rebuild, ttl=60))
    assert rebuild.count == 1
    assert results == ["v1"] * 32


def test_one_lease_attempt_per_process_for_many_callers(make_driver: Any) -> None:
    events: list[Event] = []
    sf = make_driver(on_event=events.append)
    run_threads(24, lambda: sf.get_or_rebuild("cold", Rebuilds(delay=0.2), ttl=60))
    kinds = Counter(event.kind for event in events)
    assert kinds[EventKind.LEASE_WON] + kinds[EventKind.LEASE_BUSY] == 1
    assert kinds[EventKind.REBUILD] == 1


def test_stale_key_one_refresh_everyone_else_served_stale(make_driver: Any) -> None:
    sf = make_driver()
    sf.set("hot", "old", ttl=60, stale_ttl=600)
    sf.invalidate("hot")
    rebuild = Rebuilds(lambda n: "new", delay=0.2)
    results = run_threads(32, lambda: sf.get_or_rebuild("hot", rebuild, ttl=60, stale_ttl=600))
    assert rebuild.count == 1
    assert Counter(results) == {"old": 31, "new": 1}
    assert sf.get("hot").value == "new"


def test_two_instances_share_one_lease(make_driver: Any) -> None:
    # Two instances have separate in-process flights: only the Redis lease
    # keeps them from rebuilding twice (as two processes would).
    instances = iter([make_driver(), make_driver()])
    rebuild = Rebuilds(delay=0.3)
    results = run_threads(2, lambda: next(instances).get_or_rebuild("k", rebuild, ttl=60))
    assert rebuild.count == 1
    assert results == ["v1", "v1"]


def test_background_refresh_serves_stale_to_every_caller(make_driver: Any) -> None:
    sf = make_driver()
    sf.set("hot", "old", ttl=60, stale_ttl=600)
    sf.invalidate("hot")
    rebuild = Rebuilds(lambda n: "new", delay=0.2)
    results = run_threads(
        16, lambda: sf.get_or_rebuild("hot", rebuild, ttl=60, stale_ttl=600, background=True)
    )
    assert results == ["old"] * 16
    wait_until(lambda: sf.get("hot").value == "new")
    assert rebuild.count == 1


def test_rebuild_error_reaches_caller_unchanged_and_the_lease_records_it(
    make_driver: Any, client: redis.Redis, keys: KeySpace
) -> None:
    sf = make_driver()
    boom = LookupError("database down")

    def failing() -> None:
        raise boom

    with pytest.raises(LookupError) as caught:
        sf.get_or_rebuild("k", failing, ttl=60)
    assert caught.value is boom
    # No token holds the lease: a record of the failure, for its back-off.
    assert client.get(keys("k").lease).startswith(b"!failed:1:")
    with pytest.raises(RebuildFailedError, match="LookupError: database down"):
        sf.get_or_rebuild("k", Rebuilds(), ttl=60)
    sf.delete("k")  # any write ends the back-off
    assert sf.get_or_rebuild("k", Rebuilds(), ttl=60) == "v1"


def test_rebuild_error_serves_stale_and_logs(make_driver: Any, caplog: pytest.LogCaptureFixture) -> None:
    sf = make_driver()
    sf.set("k", "old", ttl=60, stale_ttl=600)
    sf.invalidate("k")

    def failing() -> None:
        raise RuntimeError("database down")

    with caplog.at_level(logging.WARNING, logger="stampede"):
        assert sf.get_or_rebuild("k", failing, ttl=60, stale_ttl=600) == "old"
    assert "serving its stale value" in caplog.text


def test_waiters_do_not_hang_when_the_rebuild_fails(make_driver: Any) -> None:
    sf = make_driver()
    calls = Rebuilds(delay=0.2)

    def failing() -> None:
        calls()
        raise RuntimeError("down")

    results = run_threads(8, lambda: sf.get_or_rebuild("k", failing, ttl=60, wait_timeout=30))
    assert all(isinstance(result, RuntimeError) for result in results)
    assert calls.count == 1  # followers in the process share the leader's error


def test_set_get_delete(make_driver: Any) -> None:
    sf = make_driver()
    assert sf.get("k") is None
    sf.set("k", {"a": [1, 2]}, ttl=60)
    entry = sf.get("k")
    assert entry.value == {"a": [1, 2]}
    assert entry.is_fresh()
    sf.set("none", None, ttl=60)
    assert sf.get("none").value is None  # a stored None is a value, not a miss
    assert sf.get_or_rebuild("none", Rebuilds(), ttl=60) is None
    sf.delete("k")
    assert sf.get("k") is None


def test_invalidate_keeps_the_value_servable_as_stale(
    make_driver: Any, client: redis.Redis, keys: KeySpace
) -> None:
    sf = make_driver()
    assert sf.invalidate("k") is False
    assert client.exists(keys("k").value) == 0  # nothing created
    sf.set("k", "old", ttl=60, stale_ttl=0)
    pttl = client.pttl(keys("k").value)
    assert sf.invalidate("k") is True
    entry = sf.get("k")
    assert entry.value == "old"
    assert not entry.is_fresh()
    assert 0 < client.pttl(keys("k").value) <= pttl  # the hard expiry is unchanged
    assert sf.get_or_rebuild("k", Rebuilds(), ttl=60) == "v1"


@pytest.mark.parametrize("write", ["set", "delete", "invalidate"])
def test_writes_cancel_a_rebuild_in_flight(make_driver: Any, write: str) -> None:
    # A rebuild that started before the data changed must not overwrite it.
    sf = make_driver()
    sf.set("k", "old", ttl=60, stale_ttl=600)
    sf.invalidate("k")
    rebuild = Rebuilds(lambda n: "from before the write", delay=0.5)
    worker = threading.Thread(target=lambda: sf.get_or_rebuild("k", rebuild, ttl=60, stale_ttl=600))
    worker.start()
    assert rebuild.started.wait(10)
    if write == "set":
        sf.set("k", "written", ttl=60)
    else:
        getattr(sf, write)("k")
    worker.join(30)
    entry = sf.get("k")
    expected = {"set": "written", "delete": None, "invalidate": "old"}[write]
    assert (entry.value if entry else None) == expected


def test_watchdog_renews_the_lease_of_a_long_rebuild(make_driver: Any) -> None:
    first, second = make_driver(lease_ttl=0.3), make_driver(lease_ttl=0.3)
    rebuild = Rebuilds(delay=1.5)  # five lease lifetimes
    worker = threading.Thread(target=lambda: first.get_or_rebuild("k", rebuild, ttl=60))
    worker.start()
    assert rebuild.started.wait(10)
    assert second.get_or_rebuild("k", rebuild, ttl=60, wait_timeout=30) == "v1"
    worker.join(30)
    assert rebuild.count == 1


def test_lease_renewal_stops_at_max_lease_time(make_driver: Any) -> None:
    events: list[Event] = []
    first = make_driver(lease_ttl=0.2, max_lease_time=0.3, on_event=events.append)
    second = make_driver(lease_ttl=0.2)
    rebuild = Rebuilds(delay=1.5)
    worker = threading.Thread(target=lambda: first.get_or_rebuild("k", rebuild, ttl=60))
    worker.start()
    assert rebuild.started.wait(10)
    assert (
        second.get_or_rebuild("k", Rebuilds(lambda n: "taken over"), ttl=60, wait_timeout=30) == "taken over"
    )
    worker.join(30)
    assert second.get("k").value == "taken over"  # the capped holder's commit was fenced off
    assert EventKind.COMMIT_REJECTED in {event.kind for event in events}


def test_holder_is_told_when_its_lease_is_lost(make_driver: Any, client: redis.Redis, keys: KeySpace) -> None:
    events: list[Event] = []
    sf = make_driver(lease_ttl=0.3, on_event=events.append)
    rebuild = Rebuilds(lambda n: "late", delay=1.0)
    worker = threading.Thread(target=lambda: sf.get_or_rebuild("k", rebuild, ttl=60))
    worker.start()
    assert rebuild.started.wait(10)
    client.set(keys("k").lease, "someone else", px=60_000)  # taken over meanwhile
    worker.join(30)
    kinds = {event.kind for event in events}
    assert {EventKind.LEASE_LOST, EventKind.COMMIT_REJECTED} <= kinds
    assert sf.get("k") is None


def test_a_lease_key_overwritten_with_data_that_never_expires_is_taken_over(
    make_driver: Any, client: redis.Redis, keys: KeySpace
) -> None:
    # Nothing would ever free such a key: neither a new caller nor a waiter
    # already there waits on it.
    client.set(keys("cold").lease, "not a lease")
    sf = make_driver(on_wait_timeout="raise")
    assert sf.get_or_rebuild("cold", Rebuilds(), ttl=60) == "v1"
    assert sf.get("cold").value == "v1"

    events: list[Event] = []
    waiter = make_driver(on_wait_timeout="raise", on_event=events.append)
    holding = Rebuilds(lambda n: "the holder's", delay=2.0)
    holder = threading.Thread(target=lambda: sf.get_or_rebuild("k", holding, ttl=60))
    holder.start()
    assert holding.started.wait(10)
    got: list[Any] = []
    waiting = threading.Thread(
        target=lambda: got.append(waiter.get_or_rebuild("k", Rebuilds(lambda n: "the waiter's"), ttl=60))
    )
    waiting.start()
    wait_until(lambda: EventKind.LEASE_BUSY in {event.kind for event in events})
    client.set(keys("k").lease, "not a lease")  # the holder's record replaced
    waiting.join(30)
    holder.join(30)
    assert got == ["the waiter's"]  # not a WaitTimeoutError after wait_timeout
    assert EventKind.WAIT_TIMEOUT not in {event.kind for event in events}


@pytest.mark.parametrize("policy", ["raise", "rebuild"])
def test_wait_timeout_policy(make_driver: Any, client: redis.Redis, keys: KeySpace, policy: str) -> None:
    sf = make_driver(on_wait_timeout=policy)
    client.set(keys("k").lease, "a stuck holder", px=60_000)
    if policy == "raise":
        with pytest.raises(WaitTimeoutError, match="'k'"):
            sf.get_or_rebuild("k", Rebuilds(), ttl=60, wait_timeout=0.3)
        return
    assert sf.get_or_rebuild("k", Rebuilds(), ttl=60, wait_timeout=0.3) == "v1"
    assert sf.get("k") is None  # written only if nobody holds a lease: the holder may be newer


def test_value_and_lease_share_a_cluster_slot() -> None:
    space = KeySpace("ns")
    for key in ["user:42", "{tagged}x", "a}b", "}leading", "}", b"\xff\x00", "ü"]:
        names = space(key)
        assert key_slot(names.value) == key_slot(names.lease), key
    assert space("}a").value != space("}b").value


@pytest.mark.parametrize(
    "foreign",
    [
        lambda _: b"not an envelope",
        lambda _: bytes([KIND]),  # truncated header
        lambda _: bytes([KIND | SIGNED]) + b"\x00" * 80,  # a signed envelope, to a reader that does not sign
        # Another codec, and a truncated pickle, each recording the namespace's version as ours do.
        lambda version: encode(
            JsonSerializer(), [1], fresh_until=9e9, created_at=0, duration=0, namespace=version
        ),
        lambda version: encode(
            PickleSerializer(), "x" * 40, fresh_until=9e9, created_at=0, duration=0, namespace=version
        )[:-20],
        # stampede's format before this one
        lambda _: b"\xa7S\x01\x01" + struct.pack("<ddf", 9e9, 0, 0) + pickle.dumps("old"),
    ],
    ids=["text", "truncated-header", "signed", "another-codec", "truncated-pickle", "earlier-format"],
)
def test_foreign_or_corrupt_data_is_a_miss(
    make_driver: Any,
    client: redis.Redis,
    keys: KeySpace,
    foreign: Callable[[int], bytes],
    caplog: pytest.LogCaptureFixture,
) -> None:
    sf = make_driver()
    client.set(keys("k").value, foreign(namespace_version(client, sf.namespace)))
    with caplog.at_level(logging.WARNING, logger="stampede"):
        assert sf.get("k") is None
        assert sf.get_or_rebuild("k", Rebuilds(), ttl=60) == "v1"
    assert "unreadable data" in caplog.text
    assert sf.get("k").value == "v1"


def test_non_string_redis_type_is_a_miss(make_driver: Any, client: redis.Redis, keys: KeySpace) -> None:
    sf = make_driver()
    client.rpush(keys("k").value, "a", "b")
    assert sf.get("k") is None
    assert sf.get_or_rebuild("k", Rebuilds(), ttl=60) == "v1"
    assert sf.get("k").value == "v1"


def test_json_serializer(make_driver: Any) -> None:
    sf = make_driver(serializer=JsonSerializer())
    assert sf.get_or_rebuild("k", lambda: {"a": [1, None]}, ttl=60) == {"a": [1, None]}
    with pytest.raises(SerializationError, match="'k2'"):
        sf.set("k2", {1, 2}, ttl=60)


def test_unserializable_rebuilt_value_is_a_clear_error(
    make_driver: Any, client: redis.Redis, keys: KeySpace
) -> None:
    sf = make_driver()
    with pytest.raises(SerializationError, match="'k'"):
        sf.get_or_rebuild("k", lambda: threading.Lock(), ttl=60)
    assert client.exists(keys("k").lease) == 0


def test_events_reach_the_hook_and_a_failing_hook_breaks_nothing(make_driver: Any) -> None:
    events: list[Event] = []

    def hook(event: Event) -> None:
        events.append(event)
        raise RuntimeError("observer bug")

    sf = make_driver(on_event=hook)
    sf.get_or_rebuild("k", Rebuilds(), ttl=60)
    sf.get_or_rebuild("k", Rebuilds(), ttl=60)
    kinds = [event.kind for event in events]
    assert kinds == [EventKind.MISS, EventKind.LEASE_WON, EventKind.REBUILD, EventKind.HIT]
    assert events[2].duration is not None
    assert events[2].duration >= 0
    assert {event.key for event in events} == {"k"}


def test_bytes_and_str_keys(make_driver: Any) -> None:
    sf = make_driver()
    assert sf.get_or_rebuild(b"k\xff", lambda: 1, ttl=60) == 1
    assert sf.get_or_rebuild("ключ", lambda: 2, ttl=60) == 2
    assert sf.get(b"k\xff").value == 1


def test_waiter_does_not_spin_on_unreadable_data(make_driver: Any, server: Any) -> None:
    # Foreign bytes under the key while another caller rebuilds: the waiter
    # must wait for the rebuild, not probe in a loop.
    holder, waiter = make_driver(server.url), make_driver(server.url)
    with redis.Redis.from_url(server.url) as admin:
        admin.set(KeySpace(holder.namespace)("k").value, b"garbage")
        rebuild = Rebuilds(delay=1.0)
        worker = threading.Thread(target=lambda: holder.get_or_rebuild("k", rebuild, ttl=60))
        worker.start()
        assert rebuild.started.wait(10)
        admin.config_resetstat()
        assert waiter.get_or_rebuild("k", rebuild, ttl=60, wait_timeout=30) == "v1"
        scripts = admin.info("commandstats").get("cmdstat_evalsha", {"calls": 0})["calls"]
        worker.join(30)
    assert rebuild.count == 1
    assert scripts < 20  # a handful of acquires and probes, not a busy loop


def test_callers_that_time_out_in_one_process_share_one_fallback_rebuild(make_driver: Any) -> None:
    holder, waiting = make_driver(), make_driver(on_wait_timeout="rebuild")
    slow = Rebuilds(lambda n: "holder's", delay=2.0)
    worker = threading.Thread(target=lambda: holder.get_or_rebuild("k", slow, ttl=60))
    worker.start()
    assert slow.started.wait(10)
    fallback = Rebuilds(lambda n: "fallback", delay=0.3)
    results = run_threads(12, lambda: waiting.get_or_rebuild("k", fallback, ttl=60, wait_timeout=0.3))
    worker.join(30)
    assert set(results) == {"fallback"}
    # The process's leader falls back once after its own wait, and the callers
    # that gave up on the leader share a second: not one rebuild per caller.
    assert fallback.count <= 2
    assert holder.get("k").value == "holder's"  # the fallbacks were never stored


def test_early_refresh_rebuilds_a_value_that_is_still_fresh(make_driver: Any) -> None:
    sf = make_driver()
    rebuild = Rebuilds(delay=0.2)
    assert sf.get_or_rebuild("k", rebuild, ttl=5) == "v1"
    assert sf.get_or_rebuild("k", rebuild, ttl=5) == "v1"  # no beta: a plain hit
    # A 0.2 s rebuild with beta=1e9 refreshes far ahead of a 5 s expiry (it
    # stays fresh only if an exponential draw falls below 2.5e-8).
    assert sf.get_or_rebuild("k", rebuild, ttl=5, beta=1e9) == "v2"
    assert rebuild.count == 2
    assert sf.get("k").value == "v2"


def test_integers_are_stored_as_integers_for_every_serializer(make_driver: Any) -> None:
    for serializer in (PickleSerializer(), JsonSerializer()):
        sf = make_driver(serializer=serializer)
        sf.set("n", 42, ttl=60)
        assert sf.get("n").value == 42
        sf.set("flag", True, ttl=60)
        assert sf.get("flag").value is True  # bools are not ints here
        sf.set("big", 2**70, ttl=60)
        assert sf.get("big").value == 2**70
