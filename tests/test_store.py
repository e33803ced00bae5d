"""The lease handed to the caller (read/commit/release) and the rest of a
cache's operations, for both drivers against real Redis."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
import redis

from stampede import ConfigurationError, Read
from stampede._core.keys import KeySpace
from tests.helpers import lease_held, run_threads, wait_until


def test_read_a_fresh_value(make_driver: Any) -> None:
    sf = make_driver()
    sf.set("k", None, ttl=60)
    assert sf.read("k") == Read(True, None, None)  # a stored None is found


def test_read_missing_hands_one_caller_the_lease_and_the_rest_wait_for_its_commit(make_driver: Any) -> None:
    sf = make_driver()
    holder = sf.read("k", ttl=60)
    assert holder.found is False
    assert holder.lease is not None
    assert holder.lease.key == "k"
    others: list[Read] = []
    waiters = [
        threading.Thread(target=lambda: others.append(sf.read("k", wait_timeout=30))) for _ in range(5)
    ]
    for waiter in waiters:
        waiter.start()
    assert sf.commit(holder.lease, "rendered") is True
    for waiter in waiters:
        waiter.join(30)
    assert others == [Read(True, "rendered", None)] * 5


def test_read_stale_gives_the_lease_to_one_caller_and_the_stale_value_to_the_rest(make_driver: Any) -> None:
    sf = make_driver()
    sf.set("k", "old", ttl=60, stale_ttl=600)
    sf.invalidate("k")
    reads = run_threads(16, lambda: sf.read("k", ttl=60, stale_ttl=600))
    assert Counter((read.found, read.value) for read in reads) == {(True, "old"): 15, (False, None): 1}
    (winner,) = [read for read in reads if not read.found]
    assert winner.stale is not None
    assert winner.stale.value == "old"  # what the others are served meanwhile
    assert sf.commit(winner.lease, "new") is True
    assert sf.read("k").value == "new"


def test_release_lets_the_next_caller_take_the_lease_at_once(make_driver: Any) -> None:
    sf = make_driver(on_wait_timeout="raise")
    first = sf.read("k")
    sf.release(first.lease)
    second = sf.read("k", wait_timeout=30)
    assert second.lease is not None
    sf.release(second.lease)


def test_an_uncommitted_lease_blocks_nobody_past_its_ttl(make_driver: Any) -> None:
    sf = make_driver()
    first = sf.read("k", lease_ttl=0.3)
    assert first.lease is not None  # ...and its caller never commits (its view raised)
    second = sf.read("k", lease_ttl=0.3, wait_timeout=30)
    assert second.lease is not None
    assert sf.commit(first.lease, "late") is False  # the lapsed lease stores nothing
    assert sf.commit(second.lease, "on time") is True
    assert sf.get("k").value == "on time"


def test_a_write_cancels_a_handed_out_lease(make_driver: Any) -> None:
    sf = make_driver()
    lease = sf.read("k").lease
    sf.set("k", "written meanwhile", ttl=60)
    assert sf.commit(lease, "from before the write") is False
    assert sf.get("k").value == "written meanwhile"


def test_wait_timeout_on_read_is_a_miss_without_a_lease(
    make_driver: Any, client: redis.Redis, keys: KeySpace
) -> None:
    sf = make_driver(on_wait_timeout="rebuild")
    client.set(keys("k").lease, "a slow holder", px=60_000)
    assert sf.read("k", wait_timeout=0.2) == Read(False, None, None)


def test_commit_rejects_what_is_not_a_lease(make_driver: Any) -> None:
    sf = make_driver()
    with pytest.raises(ConfigurationError, match="lease must be a stampede.Lease"):
        sf.commit("token", 1)


def test_add(make_driver: Any) -> None:
    sf = make_driver()
    assert sf.add("k", "first", ttl=60) is True
    assert sf.add("k", "second", ttl=60) is False
    assert sf.get("k").value == "first"


def test_add_wakes_waiters(make_driver: Any, client: redis.Redis, keys: KeySpace) -> None:
    # Waiters would also find the value by probing, up to a second later;
    # what wakes them at once is the announcement on the key's channel.
    sf = make_driver()
    with client.pubsub(ignore_subscribe_messages=True) as listener:
        listener.subscribe(keys("k").channel)
        listener.get_message(timeout=5)  # the subscription confirmation
        assert sf.add("k", "added", ttl=60) is True
        message = listener.get_message(timeout=10)
        assert message is not None
        assert message["channel"] == keys("k").channel


def test_touch(make_driver: Any, client: redis.Redis, keys: KeySpace) -> None:
    sf = make_driver()
    assert sf.touch("k", ttl=60) is False
    sf.set("k", "v", ttl=1)
    assert sf.touch("k", ttl=600) is True
    assert 599_000 < client.pttl(keys("k").value) <= 600_000
    assert sf.get("k").fresh_until > sf.get("k").created_at + 590
    assert sf.touch("k", ttl=None) is True
    assert client.pttl(keys("k").value) == -1
    assert sf.get("k").fresh_until == float("inf")


def test_incr(make_driver: Any, client: redis.Redis, keys: KeySpace) -> None:
    sf = make_driver()
    assert sf.incr("n") is None
    sf.set("n", 41, ttl=60)
    pttl = client.pttl(keys("n").value)
    assert sf.incr("n") == 42
    assert sf.incr("n", -50) == -8
    assert sf.get("n").value == -8
    assert 0 < client.pttl(keys("n").value) <= pttl  # expiry kept
    sf.set("big", 2**62, ttl=60)
    assert sf.incr("big", 2**62 - 1) == 2**63 - 1  # exact: no float rounding
    with pytest.raises(OverflowError, match="'big'"):
        sf.incr("big")
    assert sf.get("big").value == 2**63 - 1
    sf.set("text", "abc", ttl=60)
    with pytest.raises(TypeError, match="'text' is not an integer"):
        sf.incr("text")
    with pytest.raises(ConfigurationError, match="delta must be an int"):
        sf.incr("n", 1.5)


def test_has_key(make_driver: Any) -> None:
    sf = make_driver()
    assert sf.has_key("k") is False
    sf.set("k", None, ttl=60)
    assert sf.has_key("k") is True


def test_get_set_delete_many(make_driver: Any) -> None:
    sf = make_driver()
    assert sf.get_many([]) == {}
    sf.set_many({"a": 1, b"b": [2], "c": None}, ttl=60)
    assert sf.get_many(iter(["a", b"b", "c", "missing"])) == {"a": 1, b"b": [2], "c": None}
    assert sf.delete_many(["a", "missing"]) == 1
    assert sf.delete_many([]) == 0
    assert sf.get_many(["a", b"b"]) == {b"b": [2]}


def test_clear_removes_only_this_namespace(make_driver: Any, client: redis.Redis, namespace: str) -> None:
    sf = make_driver(namespace=f"{namespace}*[x]")  # glob characters are escaped
    other = make_driver(namespace=f"{namespace}-other")
    sf.set_many({f"k{i}": i for i in range(1200)}, ttl=60)
    sf.read("leased")
    other.set("k", "kept", ttl=60)
    assert sf.clear() == 1200  # values; the lease goes too, uncounted
    assert sf.get_many(["k0", "k1199"]) == {}
    assert other.get("k").value == "kept"


def test_a_released_lease_does_not_make_the_waiters_queue(make_driver: Any, client: redis.Redis) -> None:
    sf = make_driver(on_wait_timeout="raise")
    holder = sf.read("flag")  # a key nobody stores: its holder will give up
    results: list[Read] = []
    # Five processes, as far as coalescing goes: each its own instance and subscriber.
    others = [make_driver(on_wait_timeout="raise") for _ in range(5)]
    waiters = [
        threading.Thread(target=lambda other=other: results.append(other.read("flag", wait_timeout=30)))
        for other in others
    ]
    for waiter in waiters:
        waiter.start()
    wait_until(lambda: client.pubsub_numsub(holder.lease.keys.channel)[0][1] == 5)  # all waiting
    sf.release(holder.lease)
    for waiter in waiters:
        waiter.join(30)
    # Every waiter goes on at once with a miss, none is handed a new lease to
    # hold the others up with.
    assert results == [Read(False, None, None)] * 5


@pytest.mark.usefixtures("settled")
def test_store_if_lapsed(make_driver: Any, client: redis.Redis, keys: KeySpace) -> None:
    sf = make_driver()
    # Lapsed, nobody else holds it, nothing newer: a late set still stores.
    late = sf.read("a", lease_ttl=0.05).lease
    wait_until(lambda: not lease_held(client, keys("a").lease))
    assert sf.commit(late, "late", store_if_lapsed=True) is True
    assert sf.get("a").value == "late"
    # Lapsed, and a newer value was stored meanwhile: it stays.
    sf.delete("b")
    stale = sf.read("b", lease_ttl=0.05).lease
    wait_until(lambda: not lease_held(client, keys("b").lease))
    sf.set("b", "newer", ttl=60)
    assert sf.commit(stale, "older", store_if_lapsed=True) is False
    assert sf.get("b").value == "newer"
    # Lapsed and taken by someone else: theirs will land.
    taken = sf.read("c", lease_ttl=0.05).lease
    wait_until(lambda: not lease_held(client, keys("c").lease))
    other = sf.read("c").lease
    assert sf.commit(taken, "mine", store_if_lapsed=True) is False
    assert sf.commit(other, "theirs") is True
    # Without the flag, a lapsed lease stores nothing.
    strict = sf.read("d", lease_ttl=0.05).lease
    wait_until(lambda: not lease_held(client, keys("d").lease))
    assert sf.commit(strict, "late") is False


def test_delete_prefix(make_driver: Any) -> None:
    sf = make_driver()
    sf.set_many({"user:1": 1, "user:2": 2, "user*[x]": 3, "other": 4}, ttl=60)
    assert sf.delete_prefix("user:") == 2
    assert sf.get_many(["user:1", "user:2", "user*[x]", "other"]) == {"user*[x]": 3, "other": 4}
    assert sf.delete_prefix("user*") == 1  # glob characters are literal
    with pytest.raises(ConfigurationError, match="prefix must be a non-empty str"):
        sf.delete_prefix("")


#: Keys that once shared names: a key starting with "}" was stored under a
#: digest a plain key starting with "#" could spell, and a key ending in
#: ":lease" could sit on another key's lease.
TRICKY = [
    "}user-supplied}",
    "#356c}}user-supplied",
    "}victim",
    "}victim}:lease",
    "victim}:lease",
    "a%7Db",
    "a}b",
    "a%b",
    "{x}",
    "x",
    "%",
    "}",
]


def test_no_two_keys_share_a_redis_name() -> None:
    space = KeySpace("app")
    names: dict[bytes, str] = {}
    for key in TRICKY:
        made = space(key)
        for name in (made.value, made.lease, made.channel, made.scratch):
            assert names.setdefault(name, key) == key, f"{key!r} and {names[name]!r} share {name!r}"
        # The value's name has no hash tag (a cluster slot of its own); the
        # names beside it have its whole name as theirs (the same slot).
        assert b"}" not in made.value
        for beside in (made.lease, made.channel, made.scratch):
            assert beside[beside.index(b"{") + 1 : beside.index(b"}")] == made.value


def test_tricky_keys_keep_their_own_values_and_leases(make_driver: Any) -> None:
    sf = make_driver(on_wait_timeout="raise", wait_timeout=2)
    sf.set_many({key: key.upper() for key in TRICKY}, ttl=60)
    assert sf.get_many(TRICKY) == {key: key.upper() for key in TRICKY}
    sf.delete("}victim")
    # A value under "}victim}:lease" is not a lease on "}victim": no wait.
    assert sf.get_or_rebuild("}victim", lambda: "rebuilt", ttl=60) == "rebuilt"
    assert sf.delete_prefix("#") == 1  # not the keys starting with "}"
    assert sf.get("}user-supplied}").value == "}USER-SUPPLIED}"
    assert sf.delete_prefix("}") == 4  # "}user-supplied}", "}victim", "}victim}:lease", "}"
    assert sf.delete_prefix("a%") == 2  # "a%7Db" and "a%b", not "a}b"
    assert sf.get("a}b").value == "A}B"


def test_clear_stays_in_its_namespace(make_driver: Any, client: redis.Redis, namespace: str) -> None:
    # A namespace that is a prefix of another's, and a foreign key alike.
    sf = make_driver(namespace=namespace)
    tenant = make_driver(namespace=f"{namespace}:tenant2")
    sf.set("k", 1, ttl=60)
    tenant.set("k", 2, ttl=60)
    client.set(f"{namespace}:session:42", b"theirs")
    assert sf.clear() == 1
    assert tenant.get("k").value == 2
    assert client.get(f"{namespace}:session:42") == b"theirs"
    assert tenant.delete_prefix("k") == 1


def test_function_key_is_public_and_stable() -> None:
    import stampede

    def lookup(user: int, fresh: bool = False) -> None: ...

    key_of = stampede.function_key(lookup)
    assert key_of(1) == key_of(user=1, fresh=False)
    assert key_of(1) != key_of(2)
