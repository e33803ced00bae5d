"""What child processes run in the multi-process tests (spawned, so top level)."""

from __future__ import annotations

import threading
import time
from multiprocessing.synchronize import Barrier
from typing import Any

import redis

import stampede


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
    url: str, namespace: str, key: str, count: int, interval: float, go: Any, written: Any
) -> None:
    """Once ``go`` is set, ``set`` ``key`` to 1, 2... ``count``, publishing in
    ``written`` each number whose ``set`` has returned."""
    client = redis.Redis.from_url(url, socket_timeout=10)
    sf = stampede.Stampede(client, namespace=namespace)
    go.wait(60)
    for i in range(1, count + 1):
        sf.set(key, i, ttl=60)
        written.value = i
        time.sleep(interval)
    sf.close()
    client.close()
