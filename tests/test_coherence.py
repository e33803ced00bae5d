"""No read goes back behind a write that returned before it began.

Another process writes a key over and over, publishing each number whose
``set`` has returned, and when it returned; hundreds of callers of one
process read it in a loop, each noting the time before it starts. Callers
that read one key at once share ``GET``s (one per caller would empty the
connection pool): none may hand a caller a value older than a write that
returned before it began. A near cache serves copies: none older than a write
that returned the coherence bound (1 ms) or more before the read began.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio

import stampede
import stampede.asyncio
from tests.helpers import Rebuilds, due, wait_until
from tests.workers import write_in_turn

pytestmark = pytest.mark.slow

CROWD = 400
WRITES = 300
ctx = multiprocessing.get_context("spawn")


def start_writer(url: str, namespace: str) -> tuple[Any, Any, Any, Any]:
    """The writer process (it writes once ``go`` is set), its ``written`` and
    when each write returned."""
    go = ctx.Event()
    written = ctx.Value("q", 0, lock=False)
    returned = ctx.Array("d", WRITES + 1, lock=False)
    writer = ctx.Process(
        target=write_in_turn, args=(url, namespace, "k", WRITES, 0.002, go, written, returned)
    )
    writer.start()
    return writer, go, written, returned


def must_see(returned: Any, written: int, began: float, near_cache: int | None) -> int:
    """The oldest value a read that began at ``began`` may return, ``written``
    writes having returned by then."""
    return written if near_cache is None else due(returned, written, began)


@pytest.mark.parametrize("near_cache", [None, 100], ids=["plain", "near-cache"])
def test_threads_never_read_older_than_a_write_that_returned(
    redis_url: str, namespace: str, near_cache: int | None
) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=10)
    sf = stampede.Stampede(client, namespace=namespace, near_cache=near_cache)
    sf.set("k", 0, ttl=60)
    if near_cache is not None:
        wait_until(lambda: sf._near is not None and sf._near.live)
    old: list[tuple[int, int]] = []
    reads = [0]
    start = threading.Barrier(CROWD + 1)
    writer, go, written, returned = start_writer(redis_url, namespace)

    def read_in_a_loop() -> None:
        start.wait()
        while written.value < WRITES:
            floor = written.value
            began = time.monotonic()
            value = sf.get_or_rebuild("k", Rebuilds(), ttl=60)
            floor = must_see(returned, floor, began, near_cache)
            reads[0] += 1
            if value < floor:
                old.append((value, floor))

    threads = [threading.Thread(target=read_in_a_loop) for _ in range(CROWD)]
    for thread in threads:
        thread.start()
    start.wait()
    go.set()  # every reader reads at least once before the last write
    for thread in threads:
        thread.join(60)
    writer.join(30)
    assert writer.exitcode == 0
    assert old == []
    assert reads[0] >= CROWD  # every thread read at least once while writes went on
    if near_cache is not None:
        assert sf._near.counts["hits"] > 0  # the reads did go through the near cache
    sf.close()
    client.close()


@pytest.mark.parametrize("protocol", [3, 2], ids=["resp3", "resp2"])
@pytest.mark.parametrize(("crowd", "near_cache"), [(CROWD, None), (CROWD, 100), (1, 100)])
def test_tasks_never_read_older_than_a_write_that_returned(
    redis_url: str, namespace: str, crowd: int, near_cache: int | None, protocol: int
) -> None:
    # One task alone is the hardest case for the near cache: its hits never
    # let the event loop run, so nothing but its own check sees invalidations.
    async def main() -> tuple[list[tuple[int, int]], int, int]:
        client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=10, protocol=protocol)
        sf = stampede.asyncio.Stampede(client, namespace=namespace, near_cache=near_cache)
        await sf.set("k", 0, ttl=60)
        while near_cache is not None and not sf._near.live:
            await asyncio.sleep(0.01)
        old: list[tuple[int, int]] = []
        reads = 0
        writer, go, written, returned = start_writer(redis_url, namespace)
        go.set()  # every task reads at least once before the last write

        async def read_in_a_loop() -> None:
            nonlocal reads
            while written.value < WRITES:
                floor = written.value
                began = time.monotonic()
                value = await sf.get_or_rebuild("k", Rebuilds(), ttl=60)
                floor = must_see(returned, floor, began, near_cache)
                reads += 1
                if value < floor:
                    old.append((value, floor))

        await asyncio.gather(*(read_in_a_loop() for _ in range(crowd)))
        await asyncio.to_thread(writer.join, 30)
        assert writer.exitcode == 0
        hits = sf._near.counts["hits"] if sf._near is not None else 0
        await sf.aclose()
        await client.aclose()
        return old, reads, hits

    old, reads, hits = asyncio.run(main())
    assert old == []
    assert reads >= crowd
    if near_cache is not None and crowd == 1:
        # (400 tasks: a write lands during nearly every shared GET, whose copy
        # is then not kept; the near cache is there, and must not go back.)
        assert hits > 0  # the reads did go through the near cache
