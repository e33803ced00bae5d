"""get_or_rebuild_many: one read for a batch, one rebuild call, each key single-flight."""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any

import pytest
import redis

import stampede
from tests import workers
from tests.helpers import wait_until

ctx = multiprocessing.get_context("spawn")


class BatchRebuilds:
    """A ``rebuild_many`` that records what it was asked."""

    def __init__(self, prefix: str = "v") -> None:
        self.prefix = prefix
        self.asked: list[list[Any]] = []

    def __call__(self, keys: list[Any]) -> dict[Any, Any]:
        self.asked.append(list(keys))
        return {key: f"{self.prefix}:{key}" for key in keys}


def sent(client: redis.Redis) -> int:
    return int(client.info("stats")["total_commands_processed"])


def test_a_cold_batch_is_rebuilt_in_one_call_and_a_warm_one_read_in_one_command(
    make_driver: Any, server: Any
) -> None:
    # A server of its own: what it counts is this test's commands alone.
    sf = make_driver(server.url)
    client = redis.Redis.from_url(server.url)
    keys = [f"k{i}" for i in range(100)]
    rebuild = BatchRebuilds()
    assert sf.get_or_rebuild_many(keys, rebuild, ttl=600) == {key: f"v:{key}" for key in keys}
    assert rebuild.asked == [keys]
    before = sent(client)
    assert sf.get_or_rebuild_many(keys, rebuild, ttl=600) == {key: f"v:{key}" for key in keys}
    assert rebuild.asked == [keys]
    assert sent(client) - before <= 1 + 3  # the INFO, and at most 3 for the batch
    assert sf.get("k7").value == "v:k7"  # stored as get_or_rebuild stores
    client.close()


def test_only_the_keys_that_need_it_are_rebuilt_in_the_order_given(make_driver: Any) -> None:
    sf = make_driver()
    sf.set("b", "stored b", ttl=600)
    sf.set("d", "stale d", ttl=600, stale_ttl=600)
    sf.invalidate("d")
    rebuild = BatchRebuilds()
    found = sf.get_or_rebuild_many(["e", "d", "c", "b", "a", "c"], rebuild, ttl=600)
    assert found == {"a": "v:a", "b": "stored b", "c": "v:c", "d": "v:d", "e": "v:e"}
    assert rebuild.asked == [["e", "d", "c", "a"]]
    assert sf.get_or_rebuild_many([], rebuild) == {}


def test_a_key_the_batch_function_leaves_out_is_neither_stored_nor_returned(
    make_driver: Any, client: redis.Redis, keys: Any
) -> None:
    sf = make_driver()
    found = sf.get_or_rebuild_many(["a", "b"], lambda keys: {"a": 1, "unasked": 2}, ttl=600)
    assert found == {"a": 1}
    assert sf.get("b") is None
    assert sf.get("unasked") is None
    assert client.exists(keys("b").lease) == 0  # the lease was freed
    assert sf.get_or_rebuild("b", lambda: "now", ttl=600) == "now"


def test_what_the_batch_function_returns_is_checked(make_driver: Any) -> None:
    sf = make_driver()
    with pytest.raises(stampede.ConfigurationError, match="rebuild_many must return a mapping"):
        sf.get_or_rebuild_many(["a"], lambda keys: ["not", "a", "mapping"])
    with pytest.raises(stampede.ConfigurationError, match="rebuild_many must be callable"):
        sf.get_or_rebuild_many(["a"], "nope")
    assert sf.get_or_rebuild("a", lambda: "free", ttl=600) == "free"  # no lease left behind


def test_an_error_of_the_batch_function_reaches_the_caller_and_frees_the_leases(make_driver: Any) -> None:
    sf = make_driver()

    def failing(keys: list[Any]) -> dict[Any, Any]:
        raise LookupError("database down")

    with pytest.raises(LookupError, match="database down"):
        sf.get_or_rebuild_many(["a", "b"], failing)
    # Not held until they expire: each lease records the failure (see
    # test_rebuild_backoff), and once its back-off is over the next batch rebuilds.
    rebuilds = BatchRebuilds()

    def rebuilt() -> bool:
        try:
            return sf.get_or_rebuild_many(["a", "b"], rebuilds) == {"a": "v:a", "b": "v:b"}
        except stampede.RebuildFailedError:
            return False

    wait_until(rebuilt)
    # Stale values in hand are served when the rebuild fails.
    sf.invalidate("a")
    sf.invalidate("b")
    assert sf.get_or_rebuild_many(["a", "b"], failing) == {"a": "v:a", "b": "v:b"}


def test_keys_another_caller_holds_are_served_stale_or_waited_for(make_driver: Any) -> None:
    sf = make_driver()
    other = make_driver()
    sf.set("stale", "old", ttl=600, stale_ttl=600)
    sf.invalidate("stale")
    held_stale = other.read("stale")  # another caller refreshes it
    held_missing = other.read("missing")  # another caller rebuilds it
    assert held_stale.lease is not None
    assert held_missing.lease is not None
    committer = threading.Timer(0.3, lambda: other.commit(held_missing.lease, "theirs"))
    committer.start()
    rebuild = BatchRebuilds()
    found = sf.get_or_rebuild_many(["stale", "missing", "mine"], rebuild, ttl=600)
    committer.join()
    assert found == {"stale": "old", "missing": "theirs", "mine": "v:mine"}
    assert rebuild.asked == [["mine"]]
    other.release(held_stale.lease)


def test_a_batch_carries_tags(make_driver: Any) -> None:
    sf = make_driver(tag_check_interval=0.05)
    rebuild = BatchRebuilds()
    sf.get_or_rebuild_many(["a", "b"], rebuild, ttl=600, stale_ttl=600, tags=["group"])
    sf.invalidate_tags("group")
    assert not sf.get("a").is_fresh()
    found = sf.get_or_rebuild_many(["a", "b"], BatchRebuilds("again"), ttl=600, tags=["group"])
    assert found == {"a": "again:a", "b": "again:b"}
    sf.delete_tags("group")
    assert sf.get_many(["a", "b"]) == {}


def test_an_asyncio_batch_function_may_be_a_coroutine_function(redis_url: str, namespace: str) -> None:
    import asyncio

    import stampede.asyncio

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        async with stampede.asyncio.Stampede(client, namespace=namespace) as sf:
            asked = []

            async def rebuild_many(keys: list[str]) -> dict[str, int]:
                asked.append(keys)
                await asyncio.sleep(0)
                return {key: len(key) for key in keys}

            assert await sf.get_or_rebuild_many(["a", "bb"], rebuild_many) == {"a": 1, "bb": 2}
            assert await sf.get_or_rebuild_many(["a", "bb"], rebuild_many) == {"a": 1, "bb": 2}
            assert asked == [["a", "bb"]]
        await client.aclose()

    asyncio.run(main())


def test_a_batch_on_a_cluster(cluster: Any) -> None:
    with stampede.Stampede.from_url(cluster.url, cluster=True) as sf:
        keys = [f"k{i}" for i in range(50)]
        rebuild = BatchRebuilds()
        assert sf.get_or_rebuild_many(keys, rebuild, ttl=600) == {key: f"v:{key}" for key in keys}
        assert sf.get_or_rebuild_many(keys, rebuild, ttl=600, tags=["t"]) == {key: f"v:{key}" for key in keys}
        assert rebuild.asked == [keys]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "asyncio"])
def test_processes_asking_for_the_same_cold_batch_rebuild_each_key_once(
    redis_url: str, client: redis.Redis, namespace: str, asynchronous: bool
) -> None:
    processes = 8
    keys = [f"k{i}" for i in range(100)]
    ready, queue = ctx.Barrier(processes), ctx.Queue()
    procs = [
        ctx.Process(target=workers.read_batch, args=(redis_url, namespace, keys, ready, queue, asynchronous))
        for _ in range(processes)
    ]
    for proc in procs:
        proc.start()
    results = [queue.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    assert results == [{key: f"v:{key}" for key in keys}] * processes
    assert [int(client.get(f"{namespace}:rebuilds:{key}") or 0) for key in keys] == [1] * len(keys)


def test_leases_granted_whose_replies_were_lost_are_freed(server: Any) -> None:
    # The pipelined lease request runs on Redis but its replies never come
    # back: the leases it granted must not block other callers until expiry.
    from support.proxies import FaultyProxy

    direct = redis.Redis.from_url(server.url)
    with FaultyProxy(server.port) as proxy:
        client = redis.Redis(port=proxy.port, socket_timeout=0.5, socket_connect_timeout=0.5)
        sf = stampede.Stampede(client, namespace="lost", lease_ttl=60)
        sf.get_or_rebuild_many(["warm"], BatchRebuilds())  # connected, scripts loaded
        proxy.lose_replies_from(b"EVALSHA")  # the MGET answered, the lease request not
        with pytest.raises(stampede.RedisUnavailableError):
            sf.get_or_rebuild_many(["a"], BatchRebuilds())  # one key: one EVALSHA, which runs
        assert direct.keys("lost:*:lease") == [b"lost:{lost:{a}:lease"]  # granted, its reply lost
        proxy.heal()
        # Freed in the background once Redis answers, long before it expires.
        wait_until(lambda: not direct.keys("lost:*:lease"), timeout=20)
        assert sf.get_or_rebuild_many(["a", "b"], BatchRebuilds()) == {"a": "v:a", "b": "v:b"}
        sf.close()
        client.close()
    direct.close()


def test_four_hundred_callers_of_one_batch_in_one_process_share_it(make_driver: Any) -> None:
    # redis-py's pool holds 100 connections and raises when empty: a read
    # and a lease request per caller would fail most of them.
    from tests.helpers import run_threads

    sf = make_driver()
    keys = [f"k{i}" for i in range(100)]
    asked: list[list[Any]] = []

    def rebuild_many(batch: list[Any]) -> dict[Any, Any]:
        asked.append(batch)
        time.sleep(0.2)
        return {key: f"v:{key}" for key in batch}

    results = run_threads(400, lambda: sf.get_or_rebuild_many(keys, rebuild_many, ttl=600))
    assert results == [{key: f"v:{key}" for key in keys}] * 400
    assert asked == [keys]
