"""Part 1 of ``python -m bench grouppeers``, in its worker processes: each case (a library, and how
it invalidates the group), opened on a server (:func:`open_tagged`), and the reader process that
drives it (:func:`tag_reader`): asyncio tasks reading every entry in turn, in a loop, until told
to stop, each call timed; stampede's events counted."""

from __future__ import annotations

import array
import asyncio
import functools
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event as ProcessEvent
from typing import Any

import redis
import redis.asyncio

import stampede
import stampede.asyncio

from ..peers.base import Tagged
from ..peers.cashews import CashewsTagged
from ..peers.stampede import StampedeTagged
from ._processes import REPORT_TIMEOUT, START_TIMEOUT, Message
from ._workload import (
    REBUILD,
    SOCKET_TIMEOUT,
    TAG,
    THINK,
    TTL,
    entry_keys,
    rebuild_value,
    stampede_options,
)

__all__ = ["CASHEWS_KEY", "TAG_CASES", "TagCase", "open_tagged", "tag_case", "tag_reader"]


@dataclass(frozen=True)
class TagCase:
    name: str
    label: str
    library: str  # "stampede" or "cashews"
    hard: bool
    background: bool = False
    lock: bool = False


TAG_CASES = (
    TagCase("stampede-soft", "stampede.asyncio, `invalidate_tags`", "stampede", hard=False),
    TagCase(
        "stampede-soft-background",
        "stampede.asyncio, `invalidate_tags`, `background=True`",
        "stampede",
        hard=False,
        background=True,
    ),
    TagCase("stampede-hard", "stampede.asyncio, `delete_tags`", "stampede", hard=True),
    TagCase("cashews", "cashews `@cache(tags=...)`, `delete_tags`", "cashews", hard=True),
    TagCase(
        "cashews-lock",
        "cashews `@cache(tags=..., lock=True)`, `delete_tags`",
        "cashews",
        hard=True,
        lock=True,
    ),
)


def tag_case(name: str) -> TagCase:
    for case in TAG_CASES:
        if case.name == name:
            return case
    raise KeyError(name)


#: The cashews key of an entry (the decorated function's key template).
CASHEWS_KEY = "gp:{key}"


def open_tagged(
    case: TagCase,
    url: str,
    *,
    connections: int,
    tags: tuple[str, ...] = (TAG,),
    on_event: stampede.EventHook | None = None,
) -> Tagged:
    """``case``'s library, its entries tagged ``tags``, with ``connections`` to Redis (cashews)."""
    if case.library == "stampede":
        return StampedeTagged(
            url, stampede_options(tags), hard=case.hard, background=case.background, on_event=on_event
        )
    return CashewsTagged(
        url, key_template=CASHEWS_KEY, ttl=TTL, tags=tags, lock=case.lock, connections=connections
    )


COUNTED = frozenset({stampede.EventKind.STALE_HIT, stampede.EventKind.MISS, stampede.EventKind.WAIT})


def tag_reader(
    case_name: str,
    url: str,
    entries: int,
    tasks: int,
    index: int,
    callers: int,
    spread: bool,
    start: ProcessEvent,
    stop: ProcessEvent,
    out: Queue[Message],
) -> None:
    """Worker process: ``tasks`` asyncio tasks read every entry in a loop, from ``start`` to ``stop``;
    ``spread``: each from its own place in the list, else all from the first entry."""
    try:
        report = asyncio.run(
            read_under_load(
                tag_case(case_name), url, entries, tasks, index, callers, spread, start, stop, out
            )
        )
    except BaseException:
        out.put(("error", index, traceback.format_exc()))
        raise
    out.put(("report", index, report))


async def read_under_load(
    case: TagCase,
    url: str,
    entries: int,
    tasks: int,
    index: int,
    callers: int,
    spread: bool,
    start: ProcessEvent,
    stop: ProcessEvent,
    out: Queue[Message],
) -> dict[str, Any]:
    events: Counter[str] = Counter()

    def count(event: stampede.Event) -> None:
        if event.kind in COUNTED:
            events[event.kind.value] += 1

    tagged = open_tagged(case, url, connections=tasks + 2, on_event=count)
    counter = redis.asyncio.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=10.0)
    keys = entry_keys(entries)
    log: list[tuple[str, float, float]] = []  # the rebuilds this process ran
    rebuilds = [functools.partial(rebuild_value, counter, key, REBUILD, log) for key in keys]
    starts = array.array("d")
    latencies = array.array("d")
    errors = 0
    running = True

    async def caller(offset: int) -> None:
        nonlocal errors
        position = offset
        while running:
            entry = position % entries
            position += 1
            began = time.time()
            try:
                await tagged.read(keys[entry], rebuilds[entry])
            except Exception:
                errors += 1
                await asyncio.sleep(THINK)
                continue
            ended = time.time()
            starts.append(began)
            latencies.append(ended - began)
            await asyncio.sleep(THINK)

    try:
        # Open the connections the tasks will use (hits: every entry is cached).
        await asyncio.gather(*(tagged.read(keys[i % entries], rebuilds[i % entries]) for i in range(tasks)))
        await counter.ping()
        out.put(("ready", index, None))
        if not start.wait(START_TIMEOUT):
            raise TimeoutError("never told to start")
        events.clear()
        log.clear()
        # Spread: each caller starts at its own place in the list, spread over all callers of all
        # processes. Else every caller walks the list from the first entry, as readers of one page do.
        offsets = [(index * tasks + task) * entries // callers if spread else 0 for task in range(tasks)]
        readers = [asyncio.create_task(caller(offset)) for offset in offsets]
        while not stop.is_set():
            await asyncio.sleep(0.02)
        running = False
        await asyncio.wait_for(asyncio.gather(*readers), timeout=REPORT_TIMEOUT)
    finally:
        await tagged.aclose()
        await counter.aclose()
    return {
        "starts": starts,
        "latencies": latencies,
        "rebuilt": log,
        "events": dict(events),
        "errors": errors,
    }
