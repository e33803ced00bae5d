"""Groups of entries: tags and the namespace, invalidated softly or hard in O(1)."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis

import stampede
from stampede._async.groups import DELETED_MARGIN_US
from stampede._core.envelope import HEADER_SIZE
from tests import workers
from tests.helpers import wait_until

ctx = multiprocessing.get_context("spawn")

#: What other processes see an invalidation within (no near cache): kept
#: short so that the tests need not wait; the default is 0.1 s.
INTERVAL = 0.05


class Rebuilds:
    """A rebuild function that counts its calls and returns ``value``."""

    def __init__(self, value: Any = "new") -> None:
        self.value = value
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        return self.value


def commands(client: redis.Redis) -> int:
    """How many commands Redis was sent (those a script runs aside), this INFO included."""
    stats = client.info("commandstats")
    sent = sum(int(stats[name]["calls"]) for name in stats)
    inner = ("get", "set", "time", "pttl", "pexpire", "persist")
    return sent - sum(int(stats.get(f"cmdstat_{name}", {"calls": 0})["calls"]) for name in inner)


def test_invalidate_tags_turns_the_tagged_entries_stale_everywhere(make_driver: Any) -> None:
    writer = make_driver(tag_check_interval=INTERVAL)
    reader = make_driver(tag_check_interval=INTERVAL)  # another process, as far as tags go
    writer.set("post", "old post", ttl=600, stale_ttl=600, tags=["post:1"])
    writer.set("page", "old page", ttl=600, stale_ttl=600, tags=["post:1", "user:7"])
    writer.set("user", "old user", ttl=600, stale_ttl=600, tags=["user:7"])
    writer.set("plain", "old plain", ttl=600, stale_ttl=600)
    for key in ("post", "page", "user", "plain"):
        assert reader.get_or_rebuild(key, Rebuilds(), ttl=600) == f"old {key}"
    writer.invalidate_tags("post:1")
    # Stale, not gone: served as they are while one caller refreshes each.
    assert not writer.get("post").is_fresh()
    assert not writer.get("page").is_fresh()
    assert writer.get("user").is_fresh()
    assert writer.get("plain").is_fresh()
    wait_until(lambda: not reader.get("post").is_fresh())
    rebuild = Rebuilds()
    # The caller that wins the lease refreshes it (callers meanwhile are
    # served the stale value: the many-process test below).
    assert reader.get_or_rebuild("post", rebuild, ttl=600, tags=["post:1"]) == "new"
    assert reader.get_or_rebuild("post", rebuild, ttl=600, tags=["post:1"]) == "new"
    assert reader.get("post").is_fresh()
    assert rebuild.calls == 1
    assert reader.get_or_rebuild("user", rebuild, ttl=600) == "old user"
    assert rebuild.calls == 1


def test_a_tag_check_interval_of_0_sees_an_invalidation_at_the_next_read(make_driver: Any) -> None:
    writer = make_driver()
    reader = make_driver(tag_check_interval=0)  # another process, checking on every read
    writer.set("k", "old", ttl=600, stale_ttl=600, tags=["t"])
    assert reader.get_or_rebuild("k", Rebuilds(), tags=["t"]) == "old"
    writer.invalidate_tags("t")
    assert not reader.get("k").is_fresh()  # no wait: its next read asks
    assert reader.get_or_rebuild("k", Rebuilds(), tags=["t"]) == "new"


def test_delete_tags_makes_the_tagged_entries_missing(make_driver: Any) -> None:
    sf = make_driver(tag_check_interval=INTERVAL)
    other = make_driver(tag_check_interval=INTERVAL)
    sf.set("a", "old a", tags=["t"])
    sf.set("b", "old b", tags=["u"])
    assert other.get_or_rebuild("a", Rebuilds()) == "old a"
    sf.delete_tags("t")
    assert sf.get("a") is None
    assert sf.get("b").value == "old b"
    assert sf.get_many(["a", "b"]) == {"b": "old b"}
    wait_until(lambda: other.get("a") is None)
    rebuild = Rebuilds()
    assert other.get_or_rebuild("a", rebuild, tags=["t"]) == "new"  # rebuilt, not served
    assert other.get_or_rebuild("a", rebuild, tags=["t"]) == "new"
    assert rebuild.calls == 1
    # A soft invalidation after a delete: what was rebuilt since turns stale.
    sf.invalidate_tags("t")
    entry = sf.get("a")
    assert entry.value == "new"
    assert not entry.is_fresh()


def test_invalidate_all_is_soft_for_this_namespace_only(make_driver: Any, namespace: str) -> None:
    sf = make_driver(tag_check_interval=INTERVAL)
    neighbour = make_driver(namespace=namespace + "-neighbour", tag_check_interval=INTERVAL)
    for i in range(5):
        sf.set(f"k{i}", f"old {i}", ttl=600, stale_ttl=600, tags=["t"] if i % 2 else [])
    neighbour.set("k0", "theirs", ttl=600)
    sf.invalidate_all()
    assert all(not sf.get(f"k{i}").is_fresh() for i in range(5))
    assert neighbour.get("k0").is_fresh()
    rebuild = Rebuilds()
    assert [sf.get_or_rebuild(f"k{i}", rebuild, ttl=600) for i in range(5)] == ["new"] * 5
    assert rebuild.calls == 5
    assert [sf.get_or_rebuild(f"k{i}", rebuild, ttl=600) for i in range(5)] == ["new"] * 5
    assert rebuild.calls == 5
    assert neighbour.get_or_rebuild("k0", rebuild, ttl=600) == "theirs"


def test_a_rebuild_under_way_when_its_tag_is_invalidated_stores_a_stale_value(make_driver: Any) -> None:
    sf = make_driver(tag_check_interval=INTERVAL)
    started, release = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        assert release.wait(10)
        return "read before the change"

    result: list[Any] = []
    caller = threading.Thread(target=lambda: result.append(sf.get_or_rebuild("k", slow, tags=["t"])))
    caller.start()
    assert started.wait(10)
    sf.invalidate_tags("t")  # the data changed while the rebuild was reading it
    release.set()
    caller.join(10)
    assert result == ["read before the change"]  # its own caller asked before the change
    entry = sf.get("k")
    assert entry.value == "read before the change"
    assert not entry.is_fresh()
    assert sf.get_or_rebuild("k", Rebuilds("after"), tags=["t"]) == "after"
    assert sf.get("k").is_fresh()


def test_a_value_that_lands_while_a_caller_waits_is_judged_by_tag_states_as_a_read_is(
    make_driver: Any,
) -> None:
    # Another process deletes the tag after the holder's rebuild captured
    # its state: what that rebuild stores is missing to a caller who came
    # after the deletion, whatever state of the tag its process held before.
    holder, other = make_driver(tag_check_interval=INTERVAL), make_driver()
    events: list[stampede.Event] = []
    waiter = make_driver(tag_check_interval=INTERVAL, on_event=events.append)
    assert waiter.get_or_rebuild("before", Rebuilds("x"), tags=["t"]) == "x"  # holds t's state
    started, release = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        assert release.wait(10)
        return "read before the deletion"

    holding = threading.Thread(target=lambda: holder.get_or_rebuild("k", slow, tags=["t"]))
    holding.start()
    assert started.wait(10)
    other.delete_tags("t")
    time.sleep(2 * INTERVAL)  # the waiter's state of t is older than its interval
    result: list[Any] = []
    waiting = threading.Thread(
        target=lambda: result.append(waiter.get_or_rebuild("k", Rebuilds("rebuilt after"), tags=["t"]))
    )
    waiting.start()
    wait_until(lambda: stampede.EventKind.LEASE_BUSY in {event.kind for event in events})
    release.set()
    holding.join(10)
    waiting.join(10)
    assert result == ["rebuilt after"]


def test_a_lease_committed_with_tags_after_an_invalidation_stores_a_stale_value(make_driver: Any) -> None:
    # Django's get() then set(tags=...): the tags are known only at the commit.
    sf = make_driver(tag_check_interval=INTERVAL)
    sf.set("warm", "x", tags=["t"])  # the tag's state exists
    read = sf.read("k")
    assert read.lease is not None
    sf.invalidate_tags("t")
    assert sf.commit(read.lease, "rendered before the change", tags=["t"])
    entry = sf.get("k")
    assert entry.value == "rendered before the change"
    assert not entry.is_fresh()
    # Without an invalidation in between, the value is fresh. (A lease won in
    # the very millisecond of an invalidation counts it as after: let one pass.)
    time.sleep(0.01)
    read = sf.read("k2")
    assert sf.commit(read.lease, "fine", tags=["t"])
    assert sf.get("k2").is_fresh()
    # A tag deleted in between: the value is stored as missing.
    read = sf.read("k3", tags=["u"])
    sf.set("warm-u", "x", tags=["u"])
    sf.delete_tags("u")
    assert sf.commit(read.lease, "gone", tags=["u"])
    assert sf.get("k3") is None


def test_an_invalidation_of_a_tag_nothing_carried_yet_reaches_a_lease_committed_with_it(
    make_driver: Any,
) -> None:
    # No entry carries "new-tag" yet, so it has no state, and the bump makes
    # none. A lease won before it and committed with the tag after finds a
    # state made since it was won, which knows nothing of before: the value
    # is stored stale.
    sf = make_driver()
    sf.set("other", 1)  # the namespace's state exists, as once anything was stored
    # A namespace's state made just now cannot tell whether a tag was deleted
    # just before: leases won so soon after take no chance.
    time.sleep(DELETED_MARGIN_US / 1e6)
    read = sf.read("k")
    sf.invalidate_tags("new-tag")
    assert sf.commit(read.lease, "read before the change", tags=["new-tag"])
    assert not sf.get("k").is_fresh()


def test_a_deletion_of_a_tag_nothing_carried_yet_reaches_a_lease_committed_with_it(
    make_driver: Any,
) -> None:
    # The same with delete_tags: the namespace's state notes that a tag was
    # deleted, and the value, stored with a tag whose state was made since the
    # lease was won, reads as missing.
    sf = make_driver()
    sf.set("other", 1)
    time.sleep(DELETED_MARGIN_US / 1e6)
    read = sf.read("k")
    sf.delete_tags("new-tag")
    assert sf.commit(read.lease, "read before the change", tags=["new-tag"])
    assert sf.get("k") is None
    assert sf.get("other").value == 1


def test_a_value_of_a_deleted_tag_is_missing_to_incr_touch_and_delete_prefix_keeps_tags(
    make_driver: Any, client: redis.Redis, keys: Any
) -> None:
    sf = make_driver()
    sf.set("n", 5, tags=["t"])
    sf.set("page", "p", tags=["t"])
    sf.delete_tags("t")
    assert sf.incr("n") is None  # as get() sees it: missing
    assert not sf.touch("page", ttl=60)
    assert sf.get("n") is None
    assert client.exists(keys("n").value) == 0
    sf.set("user:1", "ann", tags=["user:1"])
    sf.delete_prefix("user")
    assert client.exists(keys.prefix + b"user:1}:tag") == 1  # a group of its own
    sf.clear()
    assert client.exists(keys.prefix + b"user:1}:tag") == 0


def test_a_failed_read_of_a_tag_state_is_not_taken_for_one(
    make_driver: Any, client: redis.Redis, keys: Any
) -> None:
    events: list[stampede.EventKind] = []
    sf = make_driver(tag_check_interval=60)
    other = make_driver(tag_check_interval=60, on_event=lambda event: events.append(event.kind))
    sf.set("k", "before", ttl=600, stale_ttl=600)
    sf.invalidate_all()
    client.delete(keys.prefix + b"}:tag")
    client.rpush(keys.prefix + b"}:tag", b"not a string")  # its GET fails (WRONGTYPE)
    rebuild = Rebuilds()
    # Not served as fresh: the caller refreshes it. Holding the lease, it
    # reads the state again as a value that landed is read: foreign data
    # there is a lost state, made again, so the refresh goes through.
    assert other.get_or_rebuild("k", rebuild, ttl=600) == "new"
    assert stampede.EventKind.HIT not in events
    assert stampede.EventKind.LEASE_WON in events
    assert rebuild.calls == 1
    assert client.type(keys.prefix + b"}:tag") == b"string"


def test_invalidating_a_tag_costs_one_command_whatever_it_covers(make_driver: Any, server: Any) -> None:
    # A server of its own: thousands of keys with a TTL would slow the shared
    # one's active expiry, which other tests wait for.
    sf = make_driver(server.url)
    client = redis.Redis.from_url(server.url)
    for i in range(2_000):
        sf.set(f"k{i}", i, ttl=600, stale_ttl=600, tags=["big"])
    sf.set("small", 0, tags=["small"])
    sf.invalidate_tags("small")  # the script loaded (NOSCRIPT, SCRIPT LOAD) on this server
    before = commands(client)
    sf.invalidate_tags("big")
    big = commands(client) - before
    before = commands(client)
    sf.invalidate_tags("small")
    small = commands(client) - before
    before = commands(client)
    sf.invalidate_all()
    everything = commands(client) - before
    assert (big, small, everything) == (2, 2, 2)  # the EVALSHA, and commands()'s INFO
    client.close()
    assert not sf.get("k1999").is_fresh()
    assert sf.get("k1999").value == 1999


def test_a_tagged_entry_is_judged_by_the_tag_states_of_the_last_interval(
    make_driver: Any, server: Any
) -> None:
    # A server of its own: what it counts is this test's commands alone.
    sf = make_driver(server.url, tag_check_interval=30)  # a long interval: no state is read twice here
    client = redis.Redis.from_url(server.url)
    sf.set("k", "v", ttl=600, tags=["a", "b"])
    sf.get_or_rebuild("k", Rebuilds())  # reads the states it lacks
    before = int(client.info("stats")["total_commands_processed"])
    for _ in range(50):
        assert sf.get_or_rebuild("k", Rebuilds(), tags=["a", "b"]) == "v"
    # One GET a hit, nothing for the tags (and the INFO that counts).
    assert int(client.info("stats")["total_commands_processed"]) - before == 51
    client.close()


def test_a_tag_state_lives_as_long_as_its_entries(make_driver: Any, client: redis.Redis, keys: Any) -> None:
    sf = make_driver()
    sf.set("short", 1, ttl=10, tags=["t"])
    first = client.pttl(keys.prefix + b"t}:tag")
    sf.set("long", 1, ttl=1000, stale_ttl=1000, tags=["t"])
    assert client.pttl(keys.prefix + b"t}:tag") > 2_000_000 > first > 10_000
    sf.set("forever", 1, ttl=None, tags=["t"])
    assert client.pttl(keys.prefix + b"t}:tag") == -1
    # A state lost (evicted, deleted by hand): whatever happened to the tag
    # meanwhile is unknown, so its entries read as missing, never wrongly
    # fresh or stale; the reader makes the state again, and what is stored
    # from then on is fresh.
    client.delete(keys.prefix + b"t}:tag")
    sf.invalidate_tags("unrelated")  # nothing to do
    other = make_driver()
    assert other.get("long") is None
    other.set("long", 2, ttl=1000, tags=["t"])
    assert sf.get("long").is_fresh()


@pytest.mark.parametrize("signed", [False, True])
def test_tagged_integers_count_and_tagged_values_resist_tampering(
    make_driver: Any, client: redis.Redis, keys: Any, signed: bool
) -> None:
    sf = make_driver(signing_key="k" * 32 if signed else None)
    sf.set("n", 41, tags=["t"])
    assert sf.incr("n") == 42
    sf.invalidate_tags("t")
    entry = sf.get("n")
    assert entry.value == 42
    assert not entry.is_fresh()  # still in the group
    sf.set("v", "text", tags=["t"])
    assert sf.touch("v", ttl=900)
    assert sf.get("v").value == "text"
    if signed:
        raw = bytearray(client.get(keys("v").value))
        raw[raw.index(b"t", HEADER_SIZE)] = ord("x")  # the tag block is signed: renamed, it does not verify
        client.set(keys("v").value, bytes(raw))
        assert sf.get("v") is None


def test_a_cached_function_carries_tags(sf: stampede.Stampede) -> None:
    calls: list[int] = []

    @sf.cached(ttl=600, tags=lambda user: [f"user:{user}"])
    def profile(user: int) -> str:
        calls.append(user)
        return f"user {user}, call {len(calls)}"

    assert profile(1) == "user 1, call 1"
    assert profile(2) == "user 2, call 2"
    sf.invalidate_tags("user:1")
    assert not sf.get(profile.key(1)).is_fresh()
    assert sf.get(profile.key(2)).is_fresh()
    with pytest.raises(stampede.ConfigurationError, match="tags must be a list"):
        sf.cached(tags="user")


def test_tags_are_checked(make_driver: Any) -> None:
    sf = make_driver()
    with pytest.raises(
        stampede.ConfigurationError, match=r"tags must be a list or tuple of str.*tags=\['post'\]"
    ):
        sf.set("k", 1, tags="post")
    with pytest.raises(stampede.ConfigurationError, match="tags: each tag must be a str, got int 42"):
        sf.get_or_rebuild("k", Rebuilds(), tags=[42])
    with pytest.raises(stampede.ConfigurationError, match="must not be empty"):
        sf.invalidate_tags("")
    with pytest.raises(stampede.ConfigurationError, match="delete_tags: tag 'xxx"):
        sf.delete_tags("x" * 300)
    with pytest.raises(stampede.ConfigurationError, match="at most 64 tags"):
        sf.set("k", 1, tags=[f"t{i}" for i in range(65)])
    with pytest.raises(stampede.ConfigurationError, match="tag_check_interval"):
        make_driver(tag_check_interval=-1)


def test_a_near_cache_sees_another_processs_invalidation_at_once(make_driver: Any, server: Any) -> None:
    # A server of its own: what it counts is this test's commands alone.
    client = redis.Redis.from_url(server.url)
    writer = make_driver(server.url, tag_check_interval=60)
    reader = make_driver(server.url, near_cache=100, tag_check_interval=60)  # only tracking tells it in time
    writer.set("k", "old", ttl=600, stale_ttl=600, tags=["t"])
    assert reader.get_or_rebuild("k", Rebuilds(), tags=["t"]) == "old"
    wait_until(lambda: reader._near.counts["hits"] > 0 or reader.get_or_rebuild("k", Rebuilds()) is None)

    def twenty_hits_send_nothing() -> bool:
        # A window without the tracking connection's heartbeat (a PING every 0.5 s).
        before = int(client.info("stats")["total_commands_processed"])
        hits = [reader.get_or_rebuild("k", Rebuilds(), tags=["t"]) for _ in range(20)]
        assert hits == ["old"] * 20
        return int(client.info("stats")["total_commands_processed"]) - before == 1  # the INFO

    wait_until(twenty_hits_send_nothing)
    writer.invalidate_tags("t")
    rebuild = Rebuilds()
    wait_until(lambda: reader.get_or_rebuild("k", rebuild, tags=["t"]) == "new")
    assert rebuild.calls == 1
    client.close()


def test_tags_on_a_cluster(cluster: Any) -> None:
    with stampede.Stampede.from_url(cluster.url, cluster=True, tag_check_interval=INTERVAL) as sf:
        for i in range(30):
            sf.set(f"k{i}", i, ttl=600, stale_ttl=600, tags=[f"g{i % 3}", "all"])
        sf.invalidate_tags("g1")
        stale = {i for i in range(30) if not sf.get(f"k{i}").is_fresh()}
        assert stale == {i for i in range(30) if i % 3 == 1}
        sf.delete_tags("all")
        assert sf.get_many([f"k{i}" for i in range(30)]) == {}
        assert sf.get_or_rebuild("k0", Rebuilds(), tags=["all"]) == "new"
        sf.invalidate_all()
        assert not sf.get("k0").is_fresh()


# --- the bar: many processes, one rebuild per entry -------------------------

PROCESSES, THREADS, ENTRIES = 4, 8, 40


def run_readers(
    redis_url: str, namespace: str, act: Any, asynchronous: bool
) -> tuple[Counter[str], list[int]]:
    """4 processes x 8 callers reading 40 entries of a group while ``act()``
    invalidates it; returns their events since and each entry's rebuild count."""
    keys = [f"e{i}" for i in range(ENTRIES)]
    ready, stop, queue = ctx.Barrier(PROCESSES + 1), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=workers.read_groups,
            args=(redis_url, namespace, keys, THREADS, ready, stop, queue, asynchronous),
        )
        for _ in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    with redis.Redis.from_url(redis_url) as client:
        try:
            ready.wait(60)
            time.sleep(0.2)  # every caller reading
            act()
            wait_until(lambda: all(client.exists(f"{namespace}:rebuilds:{key}") for key in keys), timeout=60)
            sf = stampede.Stampede(client, namespace=namespace)
            wait_until(lambda: all(getattr(sf.get(key), "is_fresh", bool)() for key in keys), timeout=60)
            time.sleep(0.2)  # every process sees them fresh
        finally:
            stop.set()
        events: Counter[str] = Counter()
        for _ in procs:
            events.update(queue.get(timeout=60))
        for proc in procs:
            proc.join(30)
            assert proc.exitcode == 0
        counts = [int(client.get(f"{namespace}:rebuilds:{key}") or 0) for key in keys]
    return events, counts


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "asyncio"])
@pytest.mark.parametrize("how", ["invalidate_tags", "invalidate_all", "delete_tags"])
def test_a_group_invalidated_under_load_rebuilds_each_entry_once(
    redis_url: str, client: redis.Redis, namespace: str, how: str, asynchronous: bool
) -> None:
    sf = stampede.Stampede(client, namespace=namespace)
    for i in range(ENTRIES):
        sf.set(f"e{i}", f"old:e{i}", ttl=600, stale_ttl=600, tags=["group"])
    neighbour = stampede.Stampede(client, namespace=namespace + "-n")
    neighbour.set("e0", "theirs", ttl=600)
    act = {
        "invalidate_tags": lambda: sf.invalidate_tags("group"),
        "invalidate_all": sf.invalidate_all,
        "delete_tags": lambda: sf.delete_tags("group"),
    }[how]
    events, counts = run_readers(redis_url, namespace, act, asynchronous)
    assert counts == [1] * ENTRIES
    if how == "delete_tags":
        assert events["miss"] >= 1  # missing: the others waited for the one rebuild
    else:
        # Served stale, at once: nobody missed, nobody waited.
        assert events["miss"] == 0
        assert events["wait"] == 0
        assert events["stale_hit"] >= 1
    assert neighbour.get("e0").is_fresh()
    sf.close()
    neighbour.close()


def test_groups_and_batches_through_a_sentinel_watched_master(sentinel: Any, namespace: str) -> None:
    with stampede.Stampede.from_url(sentinel.url, namespace=namespace, tag_check_interval=INTERVAL) as sf:
        sf.set("a", 1, ttl=600, stale_ttl=600, tags=["t"])
        assert sf.get_or_rebuild_many(["a", "b"], lambda keys: {key: 2 for key in keys}, tags=["t"]) == {
            "a": 1,
            "b": 2,
        }
        sf.invalidate_tags("t")
        assert not sf.get("a").is_fresh()
        assert not sf.get("b").is_fresh()
        sf.delete_tags("t")
        assert sf.get_many(["a", "b"]) == {}


@pytest.mark.parametrize("states_held", [True, False], ids=["state-held", "state-forgotten"])
def test_a_process_sees_its_own_invalidation_at_once_through_the_hot_index(
    client: redis.Redis, namespace: str, states_held: bool
) -> None:
    sf = stampede.Stampede(client, namespace=namespace, near_cache=100)
    try:
        wait_until(lambda: sf._near.live)
        sf.set("k", "old", ttl=600, stale_ttl=600, tags=["t"])
        wait_until(lambda: sf.get_or_rebuild("k", Rebuilds(), tags=["t"]) == "old" and "k" in sf._near.hot)
        if not states_held:
            sf._settings.tags._states.clear()  # as past its bound on states held
        sf.invalidate_tags("t")
        rebuild = Rebuilds()
        assert sf.get_or_rebuild("k", rebuild, tags=["t"]) == "new"  # stale: this caller refreshed it
        assert rebuild.calls == 1
    finally:
        sf.close()
