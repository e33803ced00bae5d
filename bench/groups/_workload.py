"""What the grouppeers benchmark caches and how big a run of it is: the group's tag, the keys,
the TTLs, the rebuild (counted in Redis, so that processes add up), and :class:`Scale`
(:data:`FULL`, :data:`QUICK`)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from .._common.workload import make_value
from ..peers.base import SOCKET_TIMEOUT
from ..peers.stampede import StampedeOptions

__all__ = [
    "BATCH",
    "COUNTER",
    "FULL",
    "NAMESPACE",
    "QUICK",
    "REBUILD",
    "SLOW",
    "SOCKET_TIMEOUT",
    "STALE_TTL",
    "TAG",
    "TAG_CHECK",
    "THINK",
    "TTL",
    "Scale",
    "entry_keys",
    "rebuild_value",
    "stampede_options",
]

#: The tag every entry of the group scenario carries.
TAG = "group"
#: The stampede namespace of every case.
NAMESPACE = "grouppeers"
#: Where rebuilds are counted (one ``INCR`` per rebuilt key).
COUNTER = "grouppeers:rebuilds"
#: Seconds every entry is fresh for, and (stampede, dogpile) kept servable past that.
TTL = 3600
STALE_TTL = 600
#: How long a rebuild takes (one key, or one batch).
REBUILD = 0.05
#: A call slower than this waited for a rebuild.
SLOW = REBUILD / 2
#: Each reader task's pause between two calls.
THINK = 0.005
#: How long stampede trusts a tag's state it read (its default).
TAG_CHECK = 0.1
#: Keys in a batch.
BATCH = 100


@dataclass(frozen=True)
class Scale:
    """How big a run is: the group's entries, its readers (processes x tasks) and the seconds
    around the invalidation; the cold batch's processes and rounds; the calls timed of a warm
    batch and of a warm hit."""

    entries: int
    processes: int
    tasks: int
    before: float
    after_min: float
    after_max: float
    batch_processes: int
    rounds: int
    batch_calls: int
    hit_calls: int


FULL = Scale(
    entries=200,
    processes=4,
    tasks=8,
    before=1.0,
    after_min=1.5,
    after_max=25.0,
    batch_processes=8,
    rounds=3,
    batch_calls=200,
    hit_calls=2000,
)
QUICK = Scale(
    entries=40,
    processes=2,
    tasks=8,
    before=0.5,
    after_min=1.0,
    after_max=10.0,
    batch_processes=4,
    rounds=1,
    batch_calls=50,
    hit_calls=500,
)


async def rebuild_value(
    counter: Any, key: str, delay: float, log: list[tuple[str, float, float]] | None = None
) -> dict[str, Any]:
    """The slow query: counted in Redis; the value says when it was built. ``log`` gets
    ``(key, started, finished)``."""
    built_at = time.time()
    await counter.incr(COUNTER)
    if delay:
        await asyncio.sleep(delay)
    if log is not None:
        log.append((key, built_at, time.time()))
    return {"key": key, "built_at": built_at, **make_value()}


def stampede_options(tags: tuple[str, ...] = (TAG,)) -> StampedeOptions:
    """How every case runs stampede, its entries tagged ``tags``."""
    return StampedeOptions(NAMESPACE, TAG_CHECK, TTL, STALE_TTL, tags)


def entry_keys(entries: int) -> list[str]:
    return [f"e{i}" for i in range(entries)]


#: stampede's events counted by the readers.
