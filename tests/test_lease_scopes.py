"""Lease scopes: the leases a unit of work holds, renewed while it runs, handed
to its write, and settled when it ends; and keys that reads do not fill."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

import stampede
import stampede.asyncio
from stampede import EventKind, LeaseScope
from stampede._core.keys import KeySpace
from stampede._protocol.scripts import UNFILLED
from tests.helpers import lease_held, wait_until
from tests.observers import record, recorded


class _StoppedClock:
    """Wall-clock time as it is; monotonic time that does not pass."""

    time = staticmethod(time.time)

    @staticmethod
    def monotonic() -> float:
        return 1000.0


def kinds_of(namespace: str, kind: EventKind) -> int:
    return recorded(namespace).count(kind)


def test_a_scope_renews_its_lease_while_the_unit_of_work_runs(
    make_driver: Callable[..., Any], client: redis.Redis, keys: KeySpace
) -> None:
    sf = make_driver(lease_ttl=1.0, on_event=record)
    other = make_driver(lease_ttl=1.0, on_event=record)
    scope = LeaseScope()
    read = sf.read("slow", scope=scope)
    assert read.lease is not None
    assert scope.holds(sf, "slow")
    seen: list[stampede.Read] = []
    waiter = threading.Thread(target=lambda: seen.append(other.read("slow")))
    waiter.start()
    time.sleep(3.0)  # three lease times: a lease not renewed would have lapsed twice over
    assert lease_held(client, keys("slow").lease, read.lease.token)
    lease = scope.take(sf, "slow")
    assert lease is read.lease
    assert sf.commit(lease, "rendered", store_if_lapsed=True)
    waiter.join(30)
    # The waiter was woken by the commit: it never took the lease over.
    assert seen == [stampede.Read(True, "rendered")]
    assert kinds_of(sf.namespace, EventKind.LEASE_WON) == 1
    assert kinds_of(sf.namespace, EventKind.WAIT_TIMEOUT) == 0


def test_without_a_scope_a_read_lease_is_not_renewed(
    make_driver: Callable[..., Any], client: redis.Redis, keys: KeySpace
) -> None:
    sf = make_driver(lease_ttl=0.3)
    read = sf.read("k")
    assert read.lease is not None
    wait_until(lambda: not lease_held(client, keys("k").lease))


def test_renewal_stops_at_max_lease_time(
    make_driver: Callable[..., Any], client: redis.Redis, keys: KeySpace
) -> None:
    sf = make_driver(lease_ttl=1.0, max_lease_time=3.0)
    scope = LeaseScope()
    read = sf.read("hung", scope=scope)
    assert read.lease is not None
    time.sleep(2.0)  # two lease times: renewed
    assert lease_held(client, keys("hung").lease, read.lease.token)
    # A unit of work that hangs gives its key up to others after max_lease_time.
    wait_until(lambda: not lease_held(client, keys("hung").lease))
    assert scope.holds(sf, "hung")  # the unit's own write finds out, as after any lapse
    assert sf.read("hung").lease is not None


def test_a_lease_taken_out_of_its_scope_is_no_longer_renewed(
    make_driver: Callable[..., Any], client: redis.Redis, keys: KeySpace
) -> None:
    # Taken for a write that then never came (it raised): the lease lapses
    # within lease_ttl, as any unsettled lease, rather than being renewed.
    sf = make_driver(lease_ttl=0.5)
    scope = LeaseScope()
    assert sf.read("k", scope=scope).lease is not None
    assert scope.take(sf, "k") is not None
    assert len(sf._keeper) == 0
    wait_until(lambda: not lease_held(client, keys("k").lease))


def test_another_caller_of_the_unit_of_work_misses_without_touching_its_lease(
    make_driver: Callable[..., Any], client: redis.Redis, keys: KeySpace
) -> None:
    # One request's two threads (or tasks) read the key: the second gets a
    # miss at once, and the first one's lease stays, for its set.
    sf = make_driver()
    scope = LeaseScope()
    read = sf.read("page", scope=scope)
    assert read.lease is not None
    seen: list[stampede.Read] = []
    thread = threading.Thread(target=lambda: seen.append(sf.read("page", scope=scope)))
    thread.start()
    thread.join(30)
    assert seen == [stampede.Read(False)]
    assert scope.holds(sf, "page")
    assert lease_held(client, keys("page").lease, read.lease.token)
    sf.commit(scope.take(sf, "page"), "rendered")
    assert sf.read("page") == stampede.Read(True, "rendered")


def test_a_key_that_reads_as_missing_but_is_there_is_marked_too(
    make_driver: Callable[..., Any], client: redis.Redis, keys: KeySpace
) -> None:
    # An entry of a deleted tag reads as missing, though its bytes are there.
    sf = make_driver(on_event=record)
    sf.set("flag", "old", tags=["flags"])
    sf.delete_tags("flags")
    scope = LeaseScope()
    assert sf.read("flag", scope=scope).lease is not None
    sf.settle(scope)
    assert client.get(keys("flag").lease) == UNFILLED.encode()
    assert sf.read("flag").unfilled
    sf.set("flag", "new")
    assert sf.read("flag") == stampede.Read(True, "new")


def test_a_unit_of_work_that_never_writes_leaves_the_key_unfilled(
    make_driver: Callable[..., Any], client: redis.Redis, keys: KeySpace
) -> None:
    sf = make_driver(on_event=record)
    scope = LeaseScope()
    assert sf.read("flag", scope=scope).lease is not None
    sf.settle(scope)
    assert len(scope) == 0
    assert client.get(keys("flag").lease) == UNFILLED.encode()
    # Later reads miss at once, with no lease to take and nobody to wait for.
    for _ in range(3):
        assert sf.read("flag", scope=LeaseScope()) == stampede.Read(False, unfilled=True)
    assert kinds_of(sf.namespace, EventKind.UNFILLED) == 3
    assert kinds_of(sf.namespace, EventKind.LEASE_WON) == 1
    # A write ends it: the key is filled now.
    sf.set("flag", True)
    assert client.get(keys("flag").lease) is None
    assert sf.read("flag") == stampede.Read(True, True)


def test_an_unfilled_key_is_remembered_for_unfilled_ttl_only(
    make_driver: Callable[..., Any], client: redis.Redis, keys: KeySpace
) -> None:
    sf = make_driver(unfilled_ttl=0.3)
    scope = LeaseScope()
    assert sf.read("flag", scope=scope).lease is not None
    sf.settle(scope)
    assert sf.read("flag").unfilled
    wait_until(lambda: client.get(keys("flag").lease) is None)
    assert sf.read("flag").lease is not None


def test_unfilled_ttl_zero_remembers_nothing(make_driver: Callable[..., Any]) -> None:
    sf = make_driver(unfilled_ttl=0)
    scope = LeaseScope()
    assert sf.read("flag", scope=scope).lease is not None
    sf.settle(scope)
    assert sf.read("flag").lease is not None


def test_a_failed_unit_of_work_gives_its_leases_back_unmarked(
    make_driver: Callable[..., Any], client: redis.Redis, keys: KeySpace
) -> None:
    sf = make_driver()
    scope = LeaseScope()
    assert sf.read("page", scope=scope).lease is not None
    scope.failed = True  # its render raised: the next reader renders
    sf.settle(scope)
    assert client.exists(keys("page").lease) == 0
    assert sf.read("page").lease is not None


def test_a_stale_value_is_never_marked(
    make_driver: Callable[..., Any], client: redis.Redis, keys: KeySpace
) -> None:
    sf = make_driver()
    sf.set("page", "old", ttl=0.1, stale_ttl=60)
    wait_until(lambda: not sf.get("page").is_fresh())
    scope = LeaseScope()
    read = sf.read("page", scope=scope)
    assert read.lease is not None
    assert read.stale is not None
    sf.settle(scope)
    assert client.exists(keys("page").lease) == 0
    # Served stale to the others, refreshed by the next reader to win the lease.
    assert sf.read("page").lease is not None


def test_a_second_read_in_the_same_unit_of_work_gives_the_lease_back(
    redis_url: str, namespace: str, client: redis.Redis, keys: KeySpace
) -> None:
    with (
        stampede.Stampede.from_url(redis_url, namespace=namespace, on_event=record) as sf,
        stampede.Stampede.from_url(redis_url, namespace=namespace, on_event=record) as waiter,
    ):
        scope = LeaseScope(renew=False)
        assert sf.read("flag", scope=scope).lease is not None
        seen: list[stampede.Read] = []
        thread = threading.Thread(target=lambda: seen.append(waiter.read("flag")))
        thread.start()
        wait_until(lambda: kinds_of(namespace, EventKind.LEASE_BUSY) == 1)  # the waiter waits
        # The same caller reads it again without having written it: its unit
        # of work does not fill the key.
        again = sf.read("flag", scope=scope)
        assert again.found is False
        assert again.lease is None
        assert len(scope) == 0
        thread.join(30)
    assert seen[0].found is False
    assert seen[0].lease is None  # the waiter went on at once, without a lease of its own
    assert client.get(keys("flag").lease) == UNFILLED.encode()


async def test_asyncio_a_second_read_by_the_same_task_gives_the_lease_back(
    redis_url: str, namespace: str, client: redis.Redis, keys: KeySpace
) -> None:
    async with (
        stampede.asyncio.Stampede.from_url(redis_url, namespace=namespace, on_event=record) as asf,
        stampede.asyncio.Stampede.from_url(redis_url, namespace=namespace, on_event=record) as other,
    ):
        scope = LeaseScope(renew=False)
        assert (await asf.read("flag", scope=scope)).lease is not None
        # Another task of the same unit of work: a miss at once, the lease left alone.
        assert await asyncio.create_task(asf.read("flag", scope=scope)) == stampede.Read(False)
        assert len(scope) == 1
        waiter = asyncio.create_task(other.read("flag"))
        while kinds_of(namespace, EventKind.LEASE_BUSY) < 1:
            await asyncio.sleep(0.01)
        again = await asf.read("flag", scope=scope)  # this task, again
        assert again.found is False
        assert again.lease is None
        assert len(scope) == 0
        seen = await asyncio.wait_for(waiter, 30)
    assert seen.found is False
    assert seen.lease is None
    assert client.get(keys("flag").lease) == UNFILLED.encode()


def test_a_rebuild_takes_the_lease_over_the_mark(make_driver: Callable[..., Any]) -> None:
    sf = make_driver()
    scope = LeaseScope()
    assert sf.read("k", scope=scope).lease is not None
    sf.settle(scope)
    assert sf.read("k").unfilled
    # get_or_rebuild has a function to fill the key with: it fills it.
    assert sf.get_or_rebuild("k", lambda: 42) == 42
    assert sf.read("k") == stampede.Read(True, 42)


def test_add_fills_an_unfilled_key(
    make_driver: Callable[..., Any], client: redis.Redis, keys: KeySpace
) -> None:
    sf = make_driver()
    scope = LeaseScope()
    assert sf.read("counter", scope=scope).lease is not None
    sf.settle(scope)
    assert sf.add("counter", 1)
    assert client.exists(keys("counter").lease) == 0
    assert sf.read("counter") == stampede.Read(True, 1)


def test_a_late_commit_after_another_unit_took_the_key_over_stores_nothing(
    make_driver: Callable[..., Any], client: redis.Redis, keys: KeySpace
) -> None:
    # A lease that lapsed (no scope renews it), then another unit took the key
    # over and ended without writing. Nothing in Redis vouches any more that
    # the key was not written meanwhile (the first lease's record is gone): the
    # late write stores nothing, and the next write fills the key.
    sf = make_driver(lease_ttl=0.2)
    late = sf.read("k")
    assert late.lease is not None
    wait_until(lambda: not lease_held(client, keys("k").lease))
    scope = LeaseScope()
    assert sf.read("k", scope=scope).lease is not None
    sf.settle(scope)
    assert client.get(keys("k").lease) == UNFILLED.encode()
    assert not sf.commit(late.lease, "late", store_if_lapsed=True)
    assert sf.read("k").unfilled
    sf.set("k", "next")
    assert sf.read("k") == stampede.Read(True, "next")


def test_settle_gives_back_only_its_own_namespace(make_driver: Callable[..., Any]) -> None:
    one = make_driver()
    two = make_driver(namespace=one.namespace + "-two")
    scope = LeaseScope()
    assert one.read("k", scope=scope).lease is not None
    assert two.read("k", scope=scope).lease is not None
    one.settle(scope)
    assert not scope.holds(one, "k")
    assert scope.holds(two, "k")
    two.settle(scope)
    assert len(scope) == 0


def test_settle_refuses_what_is_not_a_scope(make_driver: Callable[..., Any]) -> None:
    sf = make_driver()
    with pytest.raises(stampede.ConfigurationError, match="scope must be a stampede.LeaseScope"):
        sf.settle({})


def test_lease_scope_settles_when_the_block_ends(
    sf: stampede.Stampede, client: redis.Redis, keys: KeySpace
) -> None:
    with sf.lease_scope() as scope:
        assert sf.read("flag", scope=scope).lease is not None
        assert scope.holds(sf, "flag")
    assert len(scope) == 0
    assert client.get(keys("flag").lease) == UNFILLED.encode()


def test_lease_scope_that_raises_fails_its_unit(
    sf: stampede.Stampede, client: redis.Redis, keys: KeySpace
) -> None:
    scopes: list[LeaseScope] = []

    def render() -> None:
        with sf.lease_scope() as scope:
            scopes.append(scope)
            assert sf.read("page", scope=scope).lease is not None
            raise RuntimeError("the render failed")

    with pytest.raises(RuntimeError, match="the render failed"):
        render()
    [scope] = scopes
    assert scope.failed
    assert client.exists(keys("page").lease) == 0


async def test_asyncio_lease_scope_renews_and_settles(
    redis_url: str, namespace: str, client: redis.Redis, keys: KeySpace
) -> None:
    async with stampede.asyncio.Stampede.from_url(redis_url, namespace=namespace, lease_ttl=1.0) as asf:
        async with asf.lease_scope() as scope:
            read = await asf.read("slow", scope=scope)
            assert read.lease is not None
            await asyncio.sleep(3.0)  # three lease times
            assert lease_held(client, keys("slow").lease, read.lease.token)
            lease = scope.take(asf, "slow")
            assert lease is not None
            assert await asf.commit(lease, "done", store_if_lapsed=True)
        assert (await asf.read("slow")) == stampede.Read(True, "done")
        async with asf.lease_scope() as scope:
            assert (await asf.read("flag", scope=scope)).lease is not None
        assert client.get(keys("flag").lease) == UNFILLED.encode()


async def test_a_lease_taken_by_asyncio_is_settled_by_the_blocking_instance(
    redis_url: str, namespace: str, client: redis.Redis, keys: KeySpace, sf: stampede.Stampede
) -> None:
    async with stampede.asyncio.Stampede.from_url(redis_url, namespace=namespace, lease_ttl=0.3) as asf:
        scope = LeaseScope()
        assert (await asf.read("k", scope=scope)).lease is not None
        assert len(asf._keeper) == 1
        # As Django does at a request's end, from a thread of its own.
        await asyncio.to_thread(sf.settle, scope)
        assert len(asf._keeper) == 0
        assert client.get(keys("k").lease) == UNFILLED.encode()


def test_closing_the_instance_stops_renewing(
    redis_url: str, namespace: str, client: redis.Redis, keys: KeySpace
) -> None:
    sf = stampede.Stampede.from_url(redis_url, namespace=namespace, lease_ttl=0.3)
    scope = LeaseScope()
    assert sf.read("k", scope=scope).lease is not None
    sf.close()
    wait_until(lambda: not lease_held(client, keys("k").lease))


def test_a_process_that_found_a_key_unfilled_asks_redis_only_for_its_value(
    make_driver: Callable[..., Any], server: Any
) -> None:
    # Reads of a key that reads do not fill cost one GET each, as a stock
    # cache's: the process remembers the mark for a moment (a moment that,
    # on this clock, does not pass).
    sf = make_driver(server.url, on_event=record, clock=_StoppedClock())
    scope = LeaseScope()
    assert sf.read("flag", scope=scope).lease is not None
    sf.settle(scope)
    assert sf.read("flag").unfilled
    with redis.Redis.from_url(server.url) as client:

        def lease_requests() -> int:
            # The lease script's runs: EVALSHA (EVAL when a script was flushed).
            stats = client.info("commandstats")
            return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval"))

        before = lease_requests()
        for _ in range(5):
            assert sf.read("flag") == stampede.Read(False, unfilled=True)
        assert lease_requests() == before
    # A write of the key by this process ends it at once.
    sf.set("flag", "on")
    assert sf.read("flag") == stampede.Read(True, "on")
