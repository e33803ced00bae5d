"""Small tools for concurrent tests."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis
import redis.cluster

from stampede import PickleSerializer
from stampede._core.codec import encode
from stampede._core.near import CHECK_SECONDS


class Rebuilds:
    """A rebuild function that counts its runs (thread-safe) and can be slow or fail."""

    def __init__(self, result: Callable[[int], Any] = lambda n: f"v{n}", delay: float = 0.0) -> None:
        self.result = result
        self.delay = delay
        self.count = 0
        self.started = threading.Event()
        self._lock = threading.Lock()

    def __call__(self) -> Any:
        with self._lock:
            self.count += 1
            n = self.count
        self.started.set()
        if self.delay:
            time.sleep(self.delay)
        return self.result(n)


class AsyncRebuilds:
    """:class:`Rebuilds` as a coroutine function (its delay awaited)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.count = 0

    async def __call__(self) -> str:
        self.count += 1
        n = self.count
        await asyncio.sleep(self.delay)
        return f"v{n}"


async def run_tasks(n: int, target: Callable[[], Awaitable[Any]]) -> list[Any]:
    """Run ``target()`` in ``n`` tasks at once; their results (or the exceptions raised)."""
    return await asyncio.gather(*(target() for _ in range(n)), return_exceptions=True)


def run_threads(n: int, target: Callable[[], Any], *, timeout: float = 60) -> list[Any]:
    """Run ``target`` in ``n`` threads released together; return results (or
    the exceptions raised). Fails if any thread is still running after ``timeout``."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def work(i: int) -> None:
        barrier.wait()
        try:
            results[i] = target()
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    stuck = sum(thread.is_alive() for thread in threads)
    assert stuck == 0, f"{stuck} of {n} callers still blocked after {timeout}s"
    return results


#: How long after another process's write returned a near cache may still
#: serve what it overwrote (stampede._core.near.CHECK_SECONDS).
COHERENCE_BOUND = CHECK_SECONDS


def due(returned: Sequence[float], written: int, began: float) -> int:
    """The newest of the writes ``1..written`` (``returned[i]``: when write ``i``
    returned, monotonic) that had returned :data:`COHERENCE_BOUND` or more
    before ``began``: what a read that began then must see, or newer."""
    while written > 0 and returned[written] > began - COHERENCE_BOUND:
        written -= 1
    return written


def past_the_coherence_bound() -> None:
    """Let the coherence bound pass after a write of another instance, so that
    a read must see it (see :data:`COHERENCE_BOUND`)."""
    time.sleep(COHERENCE_BOUND * 2)


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``condition`` until true; fail after ``timeout`` (a bound, not a measurement)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def traceback_depth(error: BaseException) -> int:
    depth, tb = 0, error.__traceback__
    while tb is not None:
        depth, tb = depth + 1, tb.tb_next
    return depth


#: Appended to when a :class:`Planted` value is unpickled: what a forged value would run.
RAN: list[str] = []


def _ran(marker: str) -> None:
    RAN.append(marker)


class Planted:
    """Unpickling this calls :func:`_ran`: a stand-in for an attacker's code."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_ran, ("planted",))


def planted_pickle() -> bytes:
    """An unsigned envelope as stampede writes it, holding a pickle that runs code when loaded."""
    return encode(PickleSerializer(), Planted(), fresh_until=9e9, created_at=0.0, duration=0.0)


def commands_processed(admin: redis.Redis) -> int:
    """Commands the server has processed, its PINGs left out (the near cache's
    heartbeats, health checks): each call counts itself too (an INFO)."""
    stats = admin.info("commandstats")
    return sum(int(stat["calls"]) for name, stat in stats.items() if name != "cmdstat_ping")


def close_core(core: Any) -> None:
    """Close a blocking core that does not own its client (the Flask extension's, the
    Flask-Caching backend's), and the client: every connection it opened."""
    core.close()
    client = core.client
    client.close()
    if isinstance(client, redis.cluster.RedisCluster):
        # Made from a URL, its nodes' clients were given pools they do not close.
        for node in client.get_nodes():
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect()
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        sentinel.close()


class DatabaseDown(Exception):
    """What the rebuilds of the tests raise while their database is down."""


def failing(attempts: list[int], delay: float = 0.0, started: threading.Event | None = None) -> Any:
    """A rebuild that counts its calls in ``attempts`` and raises
    :class:`DatabaseDown` (after ``delay`` seconds, ``started`` set first)."""

    def rebuild() -> Any:
        attempts.append(1)
        if started is not None:
            started.set()
        if delay:
            threading.Event().wait(delay)
        raise DatabaseDown("could not connect to server")

    return rebuild
