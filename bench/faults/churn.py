"""``python -m bench churn``: a long run of key churn, and whether memory stays flat.

One process, as a site's would be: a blocking instance with a near cache read by 32 threads and
an asyncio instance read by 32 tasks, over keys that keep changing (each second brings new ones
and leaves the old to expire), each carrying a tag of its object (one per 4 keys) and a tag of its
group; batches of 8; a writer that sets, deletes and invalidates keys and invalidates and deletes
tags; and asyncio callers that give up waiting (cancelled) on a slow key. Every ``--every``
seconds it samples the process's RSS, the sizes of the instances' own containers (near cache,
tag states, flights, leases kept, memos, owed removals, waiters), the blocks Python's allocator
holds, and Redis's ``DBSIZE`` beside the namespace's keys by kind (by ``SCAN``: values, leases,
tag states) and ``used_memory``.

It reports RSS after the warm-up (``--warmup``, a fifth of the run by default), halfway through
what follows and at the end, the growth in each half (memory that settles grows less in the
second), and with ``--trace`` where ``tracemalloc`` saw the memory grow after the warm-up (the
allocation sites that grew most).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import random
import sys
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil
import redis
import redis.asyncio

import stampede
import stampede.asyncio
from stampede.testing import RedisServer

from .._common.report import Section, Table, render_section
from ._evicting import kind_of

__all__ = ["Sample", "main", "run"]

THREADS = 32
TASKS = 32
#: Seconds a key lives (fresh, then stale), and how many new keys each second brings.
TTL = 2.0
STALE_TTL = 2.0
NEW_KEYS_PER_SECOND = 200
#: Of the keys alive, how many are read (the newest).
WINDOW = 2_000
REBUILD_SECONDS = 0.002
NAMESPACE = "churn"


@dataclass
class Sample:
    """One look at the process and at Redis."""

    at: float
    rss: int
    containers: dict[str, int]
    dbsize: int
    #: The namespace's keys by kind (values, leases, tag states...), by ``SCAN``.
    kinds: Counter[str]
    used_memory: int
    #: Memory blocks Python's allocator holds (``sys.getallocatedblocks``): objects alive.
    blocks: int


@dataclass
class Churn:
    """The keyspace: key ids rise with time; those within the window are read."""

    started: float = field(default_factory=time.monotonic)

    def newest(self) -> int:
        return int((time.monotonic() - self.started) * NEW_KEYS_PER_SECOND)

    def pick(self, rng: random.Random) -> int:
        newest = self.newest()
        return max(0, newest - rng.randrange(min(WINDOW, newest + 1)))


def _key(n: int) -> str:
    return f"item:{n}"


def _tags(n: int) -> list[str]:
    return [f"object:{n // 4}", f"group:{n % 50}"]


def containers(sf: Any) -> dict[str, int]:
    """The sizes of an instance's own containers, by name."""
    calls = sf._calls
    sizes = {
        "tag states": len(sf._settings.tags._states),
        "flights": len(calls.flights),
        "kept": len(calls.kept),
        "busy": len(calls.busy),
        "unfilled": len(calls.unfilled),
        "failed": len(calls.failed),
        "owed": len(sf._owed),
        "reads in flight": len(sf._reads._pending),
        "leases kept": len(sf._keeper),
        "waiters": len(sf._subscriber._channels),
    }
    if sf._near is not None:
        sizes["near copies"] = len(sf._near)
    return sizes


def _reader(sf: stampede.Stampede, churn: Churn, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        n = churn.pick(rng)
        try:
            if rng.random() < 0.1:
                keys = [_key(max(0, n - i)) for i in range(8)]
                sf.get_or_rebuild_many(keys, _rebuilt_many, ttl=TTL, stale_ttl=STALE_TTL)
            else:
                rebuild = functools.partial(_rebuilt, n)
                sf.get_or_rebuild(_key(n), rebuild, ttl=TTL, stale_ttl=STALE_TTL, tags=_tags(n))
        except stampede.StampedeError:
            pass


def _rebuilt_many(keys: list[Any]) -> dict[Any, str]:
    return {key: f"{key} " * 8 for key in keys}


def _rebuilt(n: int) -> str:
    time.sleep(REBUILD_SECONDS)
    return f"value of {n} " * 8


def _writer(sf: stampede.Stampede, churn: Churn, stop: threading.Event) -> None:
    rng = random.Random(7)
    while not stop.wait(0.005):
        n = churn.pick(rng)
        what = rng.randrange(6)
        try:
            if what == 0:
                sf.set(_key(n), f"set {n}", ttl=TTL, stale_ttl=STALE_TTL, tags=_tags(n))
            elif what == 1:
                sf.delete(_key(n))
            elif what == 2:
                sf.invalidate(_key(n))
            elif what == 3:
                sf.invalidate_tags(_tags(n)[0])
            elif what == 4:
                sf.delete_tags(_tags(n)[0])
            else:
                sf.invalidate_tags(_tags(n)[1])
        except stampede.StampedeError:
            pass


async def _async_callers(url: str, churn: Churn, stop: threading.Event, seen: dict[str, Any]) -> None:
    async with stampede.asyncio.Stampede(
        redis.asyncio.Redis.from_url(url, socket_timeout=5), namespace=NAMESPACE, near_cache=2000
    ) as asf:
        seen["async"] = asf

        async def slow(n: int) -> str:
            return await asf.get_or_rebuild(f"slow:{n}", _slow, ttl=TTL, stale_ttl=0)

        async def fill(n: int) -> str:
            async def rebuild() -> str:
                return await _arebuilt(n)

            return await asf.get_or_rebuild(_key(n), rebuild, ttl=TTL, stale_ttl=STALE_TTL, tags=_tags(n))

        async def caller(seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                n = churn.pick(rng)
                try:
                    if rng.random() < 0.05:
                        # A caller that gives up on a slow key: its wait is cancelled.
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(slow(n % 20), 0.01)
                    else:
                        await fill(n)
                except stampede.StampedeError:
                    pass

        await asyncio.gather(*(caller(1000 + i) for i in range(TASKS)))
        await asf.client.aclose()


async def _slow() -> str:
    await asyncio.sleep(0.05)
    return "slow"


async def _arebuilt(n: int) -> str:
    await asyncio.sleep(REBUILD_SECONDS)
    return f"value of {n} " * 8


def run(
    seconds: float, every: float, warmup: float, *, trace: bool = False
) -> tuple[list[Sample], list[str]]:
    """Churn for ``seconds``; samples every ``every`` seconds, and (``trace``: ``tracemalloc``,
    which costs memory of its own, a snapshot's worth at the warm-up) the allocation sites that
    grew most after ``warmup`` seconds."""
    process = psutil.Process()
    samples: list[Sample] = []
    grown: list[str] = []
    with RedisServer() as server:
        admin = redis.Redis.from_url(server.url)
        client = redis.Redis.from_url(server.url, socket_timeout=5, max_connections=100)
        sf = stampede.Stampede(client, namespace=NAMESPACE, near_cache=2000)
        churn = Churn()
        stop = threading.Event()
        seen: dict[str, Any] = {}
        threads = [
            threading.Thread(target=_reader, args=(sf, churn, stop, i), daemon=True) for i in range(THREADS)
        ]
        threads.append(threading.Thread(target=_writer, args=(sf, churn, stop), daemon=True))
        threads.append(
            threading.Thread(
                target=lambda: asyncio.run(_async_callers(server.url, churn, stop, seen)), daemon=True
            )
        )
        for thread in threads:
            thread.start()
        began = time.monotonic()
        baseline: tracemalloc.Snapshot | None = None
        if trace:
            tracemalloc.start(10)
        try:
            while (elapsed := time.monotonic() - began) < seconds:
                time.sleep(min(every, max(0.0, seconds - elapsed)))
                gc.collect()
                sizes = containers(sf)
                if "async" in seen:
                    sizes.update({f"async {name}": size for name, size in containers(seen["async"]).items()})
                info = admin.info("memory")
                samples.append(
                    Sample(
                        time.monotonic() - began,
                        process.memory_info().rss,
                        sizes,
                        int(admin.dbsize()),
                        Counter(kind_of(name, NAMESPACE) for name in admin.scan_iter(count=1000)),
                        int(info["used_memory"]),
                        sys.getallocatedblocks(),
                    )
                )
                if trace and baseline is None and samples[-1].at >= warmup:
                    baseline = tracemalloc.take_snapshot()
            if baseline is not None:
                end = tracemalloc.take_snapshot()
                for stat in end.compare_to(baseline, "traceback")[:8]:
                    frames = " < ".join(
                        f"{frame.filename.rsplit('/', 2)[-1]}:{frame.lineno}" for frame in stat.traceback[:4]
                    )
                    grown.append(f"{stat.size_diff / 1024:+.0f} KiB in {stat.count_diff:+d} blocks: {frames}")
        finally:
            tracemalloc.stop()
            stop.set()
            for thread in threads:
                thread.join(30)
            sf.close()
            client.close()
            admin.close()
    return samples, grown


def section(samples: Sequence[Sample], grown: Sequence[str], warmup: float) -> Section:
    after = [s for s in samples if s.at >= warmup]
    first, last = after[0], after[-1]
    rows = [
        [
            f"{s.at:.0f}",
            f"{s.rss / 2**20:.1f}",
            f"{s.blocks / 1000:.0f}k",
            str(s.dbsize),
            str(s.kinds["value"]),
            str(s.kinds["lease"]),
            str(s.kinds["tag state"]),
            f"{s.used_memory / 2**20:.1f}",
            ", ".join(f"{name} {size}" for name, size in s.containers.items() if size),
        ]
        for s in samples
    ]
    table = Table(
        [
            "s",
            "RSS MiB",
            "Python blocks",
            "DBSIZE",
            "values",
            "leases",
            "tag states",
            "Redis used MiB",
            "containers",
        ],
        rows,
        "rrrrrrrrl",
    )
    middle = min(after, key=lambda s: abs(s.at - (first.at + last.at) / 2))
    values = [s.kinds["value"] for s in after]
    intro = (
        f"{THREADS} threads on a blocking instance and {TASKS} tasks on an asyncio one (near caches of "
        f"2,000), {NEW_KEYS_PER_SECOND} new keys a second living {TTL + STALE_TTL:g} s, tags per object "
        f"and per group, batches of 8, a writer every 5 ms, cancelled waits. RSS {_mib(first)} at "
        f"{first.at:.0f} s (warm), {_mib(middle)} at {middle.at:.0f} s, {_mib(last)} at {last.at:.0f} s: "
        f"{_growth(first, last)} after the warm-up ({_growth(first, middle)}, then {_growth(middle, last)}). "
        f"After the warm-up DBSIZE was {min(s.dbsize for s in after)} to {max(s.dbsize for s in after)} "
        f"for {min(values)} to {max(values)} values. "
        + (
            "Allocation sites that grew most after the warm-up (tracemalloc): " + "; ".join(grown) + "."
            if grown
            else ""
        )
    )
    return Section("Churn", intro, table)


def _mib(sample: Sample) -> str:
    return f"{sample.rss / 2**20:.1f} MiB"


def _growth(before: Sample, after: Sample) -> str:
    return f"{(after.rss - before.rss) / before.rss:+.1%}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench churn", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the churn lasts")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between two samples")
    parser.add_argument("--warmup", type=float, default=None, help="seconds of warm-up (a fifth)")
    parser.add_argument("--trace", action="store_true", help="where memory grew (tracemalloc; costs memory)")
    args = parser.parse_args(argv)
    seconds = args.minutes * 60
    warmup = seconds / 5 if args.warmup is None else args.warmup
    samples, grown = run(seconds, args.every, warmup, trace=args.trace)
    print(render_section(section(samples, grown, warmup)))
