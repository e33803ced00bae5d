"""What child processes run in the multi-process tests (spawned, so top level)."""

from __future__ import annotations

import threading
import time
from multiprocessing.synchronize import Barrier
from typing import Any

import redis
import redis.asyncio

import stampede
import stampede.asyncio


def counting_rebuild(client: redis.Redis, counter: str, value: Any, delay: float) -> Any:
    client.incr(counter)
    time.sleep(delay)
    return value


def callers(
    url: str,
    namespace: str,
    key: str,
    threads: int,
    barrier: Barrier,
    options: dict[str, Any],
    value: Any,
    delay: float,
) -> list[Any]:
    """``threads`` callers of ``key`` in this process, released with every other process's."""
    client = redis.Redis.from_url(url, socket_timeout=10)
    sf = stampede.Stampede(client, namespace=namespace)
    results: list[Any] = [None] * threads
    local = threading.Barrier(threads)

    def call(i: int) -> None:
        local.wait()
        try:
            results[i] = sf.get_or_rebuild(
                key, lambda: counting_rebuild(client, f"{namespace}:rebuilds", value, delay), **options
            )
        except Exception as exc:
            results[i] = f"error: {exc!r}"

    workers = [threading.Thread(target=call, args=(i,)) for i in range(threads)]
    barrier.wait(30)
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    sf.close()
    client.close()
    return results


def run_callers(queue: Any, *args: Any) -> None:
    queue.put(callers(*args))


def hold_lease(url: str, namespace: str, key: str, lease_ttl: float, delay: float, queue: Any) -> None:
    """Take the lease of ``key`` and rebuild slowly; report what happened to ``queue``."""
    client = redis.Redis.from_url(url, socket_timeout=10)
    events: list[str] = []
    sf = stampede.Stampede(
        client, namespace=namespace, lease_ttl=lease_ttl, on_event=lambda e: events.append(e.kind.value)
    )

    def rebuild() -> str:
        client.set(f"{namespace}:started", "1")
        time.sleep(delay)
        return "from the paused holder"

    result = sf.get_or_rebuild(key, rebuild, ttl=60)
    client.close()
    queue.put((result, events))


def write_in_turn(
    url: str, namespace: str, key: str, count: int, interval: float, go: Any, written: Any, returned: Any
) -> None:
    """Once ``go`` is set, ``set`` ``key`` to 1, 2... ``count``, publishing in
    ``written`` each number whose ``set`` has returned, and in ``returned[i]``
    when write ``i`` returned (monotonic, which every process shares)."""
    client = redis.Redis.from_url(url, socket_timeout=10)
    sf = stampede.Stampede(client, namespace=namespace)
    go.wait(60)
    for i in range(1, count + 1):
        sf.set(key, i, ttl=60)
        returned[i] = time.monotonic()
        written.value = i
        time.sleep(interval)
    sf.close()
    client.close()


def read_groups(
    url: str,
    namespace: str,
    keys: list[str],
    threads: int,
    ready: Barrier,
    stop: Any,
    queue: Any,
    asynchronous: bool,
) -> None:
    """``threads`` callers (or tasks) reading ``keys``, all tagged ``"group"``,
    over and over until ``stop`` is set; reports the events of the calls made
    once every process was reading (what an invalidation then did to them)."""
    counts: dict[str, int] = {}
    counting = threading.Event()

    def on_event(event: stampede.Event) -> None:
        if counting.is_set():
            counts[event.kind.value] = counts.get(event.kind.value, 0) + 1

    def rebuild_of(client: redis.Redis, key: str) -> Any:
        def rebuild() -> str:
            client.incr(f"{namespace}:rebuilds:{key}")
            time.sleep(0.05)
            return f"new:{key}"

        return rebuild

    options: dict[str, Any] = {"ttl": 600, "stale_ttl": 600, "tags": ("group",)}
    client = redis.Redis.from_url(url, socket_timeout=10)
    if asynchronous:
        import asyncio

        async def main() -> None:
            sf = stampede.asyncio.Stampede(
                redis.asyncio.Redis.from_url(url, socket_timeout=10), namespace=namespace, on_event=on_event
            )

            async def caller() -> None:
                while not stop.is_set():
                    for key in keys:
                        await sf.get_or_rebuild(key, rebuild_of(client, key), **options)

            await sf.get_or_rebuild(keys[0], rebuild_of(client, keys[0]), **options)
            await asyncio.to_thread(ready.wait)
            counting.set()
            await asyncio.gather(*(caller() for _ in range(threads)))
            await sf.aclose()
            await sf.client.aclose()

        asyncio.run(main())
    else:
        sf = stampede.Stampede(client, namespace=namespace, on_event=on_event)

        def caller() -> None:
            while not stop.is_set():
                for key in keys:
                    sf.get_or_rebuild(key, rebuild_of(client, key), **options)

        sf.get_or_rebuild(keys[0], rebuild_of(client, keys[0]), **options)
        ready.wait()
        counting.set()
        running = [threading.Thread(target=caller) for _ in range(threads)]
        for thread in running:
            thread.start()
        for thread in running:
            thread.join()
        sf.close()
    queue.put(counts)


def read_batch(
    url: str, namespace: str, keys: list[str], ready: Barrier, queue: Any, asynchronous: bool
) -> None:
    """One ``get_or_rebuild_many`` of ``keys`` once every process is ready;
    each key rebuilt counts in Redis."""
    client = redis.Redis.from_url(url, socket_timeout=10)

    def rebuild_many(asked: list[str]) -> dict[str, str]:
        for key in asked:
            client.incr(f"{namespace}:rebuilds:{key}")
        time.sleep(0.1)
        return {key: f"v:{key}" for key in asked}

    if asynchronous:
        import asyncio

        async def main() -> dict[Any, Any]:
            sf = stampede.asyncio.Stampede(
                redis.asyncio.Redis.from_url(url, socket_timeout=10), namespace=namespace
            )

            async def arebuild_many(asked: list[str]) -> dict[str, str]:
                return await asyncio.to_thread(rebuild_many, asked)

            await asyncio.to_thread(ready.wait)
            found = await sf.get_or_rebuild_many(keys, arebuild_many, ttl=600)
            await sf.aclose()
            await sf.client.aclose()
            return found

        queue.put(asyncio.run(main()))
    else:
        sf = stampede.Stampede(client, namespace=namespace)
        ready.wait()
        queue.put(sf.get_or_rebuild_many(keys, rebuild_many, ttl=600))
        sf.close()
