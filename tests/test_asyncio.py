"""What only the asyncio driver can get wrong: cancellation and the event loop."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

import stampede.asyncio
from stampede._core.keys import KeySpace
from stampede.testing import RedisServer
from tests.helpers import traceback_depth


@pytest.fixture
async def aclient(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=5)
    yield client
    await client.aclose()


@pytest.fixture
def asf(aclient: redis.asyncio.Redis, namespace: str) -> stampede.asyncio.Stampede:
    return stampede.asyncio.Stampede(aclient, namespace=namespace)


async def eventually(condition: object, timeout: float = 10) -> None:
    async def poll() -> None:
        while not await condition():  # type: ignore[operator]
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


async def test_many_tasks_one_rebuild(asf: stampede.asyncio.Stampede) -> None:
    calls = 0

    async def rebuild() -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.2)
        return "v"

    assert await asyncio.gather(*[asf.get_or_rebuild("k", rebuild, ttl=60) for _ in range(50)]) == ["v"] * 50
    assert calls == 1


async def test_sync_rebuild_runs_off_the_event_loop(asf: stampede.asyncio.Stampede) -> None:
    loop_thread = threading.current_thread()
    ran_in: list[threading.Thread] = []

    def rebuild() -> str:
        ran_in.append(threading.current_thread())
        return "v"

    assert await asf.get_or_rebuild("k", rebuild, ttl=60) == "v"
    assert ran_in
    assert ran_in[0] is not loop_thread


async def test_cancelled_leader_frees_the_lease_and_does_not_poison_followers(
    asf: stampede.asyncio.Stampede, aclient: redis.asyncio.Redis, namespace: str
) -> None:
    started = asyncio.Event()
    calls = 0

    async def rebuild() -> str:
        nonlocal calls
        calls += 1
        started.set()
        await asyncio.sleep(0.3 if calls > 1 else 30)
        return f"v{calls}"

    lease = KeySpace(namespace)("k").lease
    leader = asyncio.create_task(asf.get_or_rebuild("k", rebuild, ttl=60, lease_ttl=30))
    await started.wait()
    token = await aclient.get(lease)
    assert token is not None
    followers = [asyncio.create_task(asf.get_or_rebuild("k", rebuild, ttl=60)) for _ in range(5)]
    await asyncio.sleep(0.05)
    leader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leader
    # Released before the cancellation surfaced, not left for its 30 s TTL
    # (a follower may already hold a new lease).
    assert await aclient.get(lease) != token
    assert await asyncio.gather(*followers) == ["v2"] * 5
    assert calls == 2
    assert await aclient.exists(lease) == 0


async def test_cancelled_waiter_leaves_nothing_behind(
    redis_url: str, asf: stampede.asyncio.Stampede, aclient: redis.asyncio.Redis, namespace: str
) -> None:
    other = stampede.asyncio.Stampede.from_url(redis_url, namespace=namespace)
    started = asyncio.Event()
    finish = asyncio.Event()  # the holder's rebuild lasts until the waiter is cancelled

    async def slow() -> str:
        started.set()
        await finish.wait()
        return "v"

    try:
        holder = asyncio.create_task(other.get_or_rebuild("k", slow, ttl=60))
        await started.wait()
        waiter = asyncio.create_task(asf.get_or_rebuild("k", slow, ttl=60, wait_timeout=30))
        channel = KeySpace(namespace)("k").channel

        async def subscribed() -> bool:
            return bool((await aclient.pubsub_numsub(channel))[0][1])

        await eventually(subscribed)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter

        async def unsubscribed() -> bool:
            return not await subscribed()

        await eventually(unsubscribed)
        finish.set()
        assert await holder == "v"
        assert await asf.get_or_rebuild("k", slow, ttl=60) == "v"
    finally:
        finish.set()
        await other.aclose()


async def test_background_refresh_runs_as_a_task(asf: stampede.asyncio.Stampede) -> None:
    await asf.set("k", "old", ttl=60, stale_ttl=600)
    await asf.invalidate("k")

    async def rebuild() -> str:
        await asyncio.sleep(0.1)
        return "new"

    served = await asyncio.gather(
        *[asf.get_or_rebuild("k", rebuild, ttl=60, stale_ttl=600, background=True) for _ in range(10)]
    )
    assert served == ["old"] * 10
    await asf.aclose()  # waits for the refresh
    entry = await asf.get("k")
    assert entry is not None
    assert entry.value == "new"


async def test_cancelled_caller_of_a_thread_rebuild_keeps_the_lease_until_it_lands(
    asf: stampede.asyncio.Stampede, aclient: redis.asyncio.Redis, namespace: str
) -> None:
    # A thread cannot be stopped: freeing the lease under it would start a
    # second rebuild beside it. The caller leaves; the rebuild still lands.
    calls: list[int] = []
    running = threading.Event()

    def slow() -> str:
        calls.append(1)
        running.set()
        time.sleep(0.5)
        return "from the thread"

    lease = KeySpace(namespace)("k").lease
    caller = asyncio.create_task(asf.get_or_rebuild("k", slow, ttl=60))
    await asyncio.to_thread(running.wait, 10)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert await aclient.exists(lease) == 1
    assert await asf.get_or_rebuild("k", slow, ttl=60, wait_timeout=30) == "from the thread"
    assert calls == [1]
    await asf.aclose()
    assert await aclient.exists(lease) == 0


async def test_a_shared_error_keeps_the_leaders_traceback(asf: stampede.asyncio.Stampede) -> None:
    async def failing() -> None:
        await asyncio.sleep(0.2)
        raise RuntimeError("down")

    results = await asyncio.gather(
        *[asf.get_or_rebuild("k", failing, ttl=60) for _ in range(30)], return_exceptions=True
    )
    assert len({id(result) for result in results}) == 1
    assert isinstance(results[0], RuntimeError)
    assert traceback_depth(results[0]) < 15


@pytest.mark.parametrize("kind", ["coroutine", "function"])
async def test_a_cancellation_storm_leaves_no_lease_no_flight_and_no_second_rebuild(
    redis_url: str, namespace: str, kind: str
) -> None:
    # Two "processes" (instances), 200 tasks each on one cold key; every
    # 20-60 ms a random half of the tasks still running are cancelled,
    # leaders included, for ten rounds of expiry. Afterwards: at most two
    # rebuilds ever ran at once (a cancelled coroutine rebuild is stopped
    # before its lease is freed; a function rebuild runs on in its thread
    # under its lease), nothing was served but whole values, no lease, no
    # flight and no shared read is left behind, and the key still works.
    instances = [stampede.asyncio.Stampede.from_url(redis_url, namespace=namespace) for _ in range(2)]
    running = 0
    most = 0
    lock = threading.Lock()

    def enter() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)

    def leave() -> None:
        nonlocal running
        with lock:
            running -= 1

    async def arebuild() -> str:
        enter()
        try:
            await asyncio.sleep(0.05)
            return "whole"
        finally:
            leave()

    def rebuild() -> str:
        enter()
        try:
            time.sleep(0.05)
            return "whole"
        finally:
            leave()

    chosen = arebuild if kind == "coroutine" else rebuild
    rng = random.Random(5)
    for _ in range(10):
        tasks = [
            asyncio.create_task(sf.get_or_rebuild("k", chosen, ttl=0.05, lease_ttl=30, wait_timeout=5))
            for sf in instances
            for _ in range(200)
        ]
        while not all(task.done() for task in tasks):
            await asyncio.sleep(rng.uniform(0.02, 0.06))
            live = [task for task in tasks if not task.done()]
            for task in rng.sample(live, len(live) // 2):
                task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert {r for r in results if not isinstance(r, asyncio.CancelledError)} <= {"whole"}, results
        await asyncio.sleep(0.06)  # expired: the next round misses again
    assert most <= 2
    lease = KeySpace(namespace)("k").lease
    client = instances[0].client
    await eventually(lambda: _absent(client, lease))  # function rebuilds release in the background
    for sf in instances:
        assert len(sf._calls.flights) == 0
        assert not sf._reads._pending
    assert await instances[1].get_or_rebuild("k", arebuild, ttl=60) == "whole"
    for sf in instances:
        await sf.aclose()


async def _absent(client: redis.asyncio.Redis, name: bytes) -> bool:
    return await client.exists(name) == 0


async def test_a_cancelled_reader_hands_the_shared_read_on_not_one_read_per_task(
    server: RedisServer, namespace: str
) -> None:
    # 300 tasks share the reader's GET; the reader is cancelled while Redis is
    # frozen. The others must elect one new reader, not each read (300 reads
    # would empty redis-py's pool of 100 and fail with "Too many connections").
    sf = stampede.asyncio.Stampede.from_url(server.url, namespace=namespace)
    await sf.set("k", "v", ttl=60)
    server.pause()
    try:
        tasks = [asyncio.create_task(sf.get("k")) for _ in range(300)]
        await asyncio.sleep(0.2)  # every task is in: the first one reads, the rest share it
        tasks[0].cancel()
        await asyncio.sleep(0.2)
    finally:
        server.resume()
    results = await asyncio.gather(*tasks[1:], return_exceptions=True)
    assert [entry.value for entry in results if not isinstance(entry, BaseException)] == ["v"] * 299
    await sf.aclose()


async def test_background_refreshes_run_at_most_background_workers_at_once(
    aclient: redis.asyncio.Redis, namespace: str
) -> None:
    # Many keys going stale at once: as with the blocking flavour's threads,
    # their refreshes queue rather than all hold a pool connection at once.
    async with stampede.asyncio.Stampede(aclient, namespace=namespace, background_workers=2) as asf:
        keys = [f"stale:{i}" for i in range(12)]
        for key in keys:
            await asf.set(key, "old", ttl=0.01, stale_ttl=60)
        await asyncio.sleep(0.05)
        running = most = 0

        async def refresh() -> str:
            nonlocal running, most
            running += 1
            most = max(most, running)
            await asyncio.sleep(0.05)
            running -= 1
            return "new"

        served = await asyncio.gather(
            *[asf.get_or_rebuild(key, refresh, ttl=60, background=True) for key in keys]
        )
        assert served == ["old"] * len(keys)  # served stale at once, refreshed behind
    # Leaving the block waited for every refresh.
    assert most == 2
    async with stampede.asyncio.Stampede(aclient, namespace=namespace) as again:
        assert [(await again.get(key)).value for key in keys] == ["new"] * len(keys)  # type: ignore[union-attr]


def test_background_workers_must_be_a_positive_int(aclient: redis.asyncio.Redis) -> None:
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(stampede.ConfigurationError, match="background_workers"):
            stampede.asyncio.Stampede(aclient, background_workers=bad)  # type: ignore[arg-type]


async def test_a_detached_rebuild_commits_while_background_refreshes_fill_every_slot(
    aclient: redis.asyncio.Redis, namespace: str
) -> None:
    # The commit of a cancelled caller's thread rebuild must not queue behind
    # slow refreshes: its lease would lapse and a second rebuild start.
    async with stampede.asyncio.Stampede(aclient, namespace=namespace, background_workers=1) as asf:
        await asf.set("stale", "old", ttl=0.01, stale_ttl=60)
        await asyncio.sleep(0.05)
        release_refresh = asyncio.Event()

        async def slow_refresh() -> str:
            await release_refresh.wait()
            return "new"

        try:
            assert await asf.get_or_rebuild("stale", slow_refresh, ttl=60, background=True) == "old"
            running = threading.Event()

            def in_thread() -> str:
                running.set()
                time.sleep(0.2)
                return "from the thread"

            caller = asyncio.create_task(asf.get_or_rebuild("cold", in_thread, ttl=60))
            await asyncio.to_thread(running.wait, 10)
            caller.cancel()
            with pytest.raises(asyncio.CancelledError):
                await caller

            async def landed() -> bool:
                entry = await asf.get("cold")
                return entry is not None and entry.value == "from the thread"

            await eventually(landed)  # while the refresh still holds the only slot
        finally:
            release_refresh.set()
