"""Part 1 of ``python -m bench grouppeers``: a group invalidated under load, and the invalidation
itself on a quiet server.

N entries, each tagged ``group``, are cached; P processes x T asyncio tasks read every entry in
turn, in a loop, with a pause between calls, and the group is invalidated once from the parent,
into the load; the load goes on until Redis holds a rebuilt value of every entry. stampede
(``invalidate_tags``, the same with ``background=True``, ``delete_tags``) beside cashews
(``@cache(tags=...)``, with and without ``lock=True``, ``delete_tags``); the callers starting
spread over the entries, then all walking them in the same order. See :mod:`.grouppeers`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.context import SpawnContext
from multiprocessing.queues import Queue
from typing import Any

import redis
import redis.asyncio

from .._common.report import Section, Table, millis
from ..peers.base import Tagged
from ._monitor import Tally, monitored
from ._processes import REPORT_TIMEOUT, START_TIMEOUT, Message, expect, finish
from ._readers import TagCase, open_tagged, tag_reader
from ._workload import (
    COUNTER,
    REBUILD,
    SLOW,
    SOCKET_TIMEOUT,
    TAG,
    TAG_CHECK,
    THINK,
    Scale,
    entry_keys,
    rebuild_value,
)

__all__ = ["LAYOUTS", "TagResult", "run_tag_case", "tag_sections"]


@dataclass(frozen=True)
class Invalidation:
    """One invalidation of the group, on the quiet server."""

    tally: Tally
    seconds: float


@dataclass(frozen=True)
class TagResult:
    case: TagCase
    quiet: Invalidation
    rebuilds: int
    entries: int
    calls_before: int
    slow_before: int
    calls_after: int
    slow_after: int
    worst_after: float
    window: float  # seconds the load went on after the invalidation
    events: Counter[str]
    fresh: int  # entries read rebuilt after the invalidation
    all_fresh: float  # seconds from the invalidation to the last of them (nan: not every entry)
    errors: int


async def warm(tagged: Tagged, counter: Any, keys: Sequence[str]) -> None:
    """Read every key through the library, rebuilding (without the delay) what is stale or missing."""
    limit = asyncio.Semaphore(16)

    async def one(key: str) -> None:
        async with limit:
            await tagged.read(key, functools.partial(rebuild_value, counter, key, 0.0))

    await asyncio.gather(*(one(key) for key in keys))


async def run_tag_case(
    case: TagCase, url: str, scale: Scale, context: SpawnContext, *, spread: bool
) -> TagResult:
    admin = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT)
    admin.flushall()
    # This process warms the entries and invalidates: its reads never refresh in the background.
    tagged = open_tagged(dataclasses.replace(case, background=False), url, connections=8)
    counter = redis.asyncio.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT)
    keys = entry_keys(scale.entries)
    out: Queue[Message] = context.Queue()
    start, stop = context.Event(), context.Event()
    callers = scale.processes * scale.tasks
    processes = [
        context.Process(
            target=tag_reader,
            args=(case.name, url, scale.entries, scale.tasks, i, callers, spread, start, stop, out),
            daemon=True,
        )
        for i in range(scale.processes)
    ]
    try:
        await warm(tagged, counter, keys)
        await tagged.invalidate("warm-up")  # an empty group: loads what the library loads on first use
        with monitored(url) as tally:
            began = time.perf_counter()
            await tagged.invalidate(TAG)
            took = time.perf_counter() - began
        quiet = Invalidation(tally, took)
        await warm(tagged, counter, keys)
        admin.delete(COUNTER)
        for process in processes:
            process.start()
        expect(out, processes, "ready", len(processes), START_TIMEOUT)
        start.set()
        await asyncio.sleep(scale.before)
        invalidated_at = time.time()
        await tagged.invalidate(TAG)
        await until_rebuilt(tagged, keys, invalidated_at, scale)
        window = time.time() - invalidated_at
        stop.set()
        reports = expect(out, processes, "report", len(processes), REPORT_TIMEOUT)
    finally:
        start.set()
        stop.set()
        finish(processes)
        await tagged.aclose()
        await counter.aclose()
    rebuilds = int(admin.get(COUNTER) or 0)
    admin.close()
    return summarize(case, quiet, rebuilds, scale.entries, invalidated_at, window, reports)


async def until_rebuilt(tagged: Tagged, keys: Sequence[str], since: float, scale: Scale) -> None:
    """Return once Redis holds a value of every key built after ``since`` (polled 4 times a second,
    one batch read each), but not before ``after_min`` nor after ``after_max`` seconds from it."""
    while True:
        await asyncio.sleep(0.25)
        elapsed = time.time() - since
        if elapsed >= scale.after_max:
            return
        if elapsed < scale.after_min:
            continue
        values = await tagged.stored(keys)
        if all(value is not None and value["built_at"] >= since for value in values):
            return


def summarize(
    case: TagCase,
    quiet: Invalidation,
    rebuilds: int,
    entries: int,
    invalidated_at: float,
    window: float,
    reports: Sequence[dict[str, Any]],
) -> TagResult:
    calls_before = slow_before = calls_after = slow_after = errors = 0
    worst_after = 0.0
    events: Counter[str] = Counter()
    fresh_at: dict[str, float] = {}  # entry -> when the first rebuild begun after the invalidation ended
    for report in reports:
        for began, latency in zip(report["starts"], report["latencies"], strict=True):
            slow = latency > SLOW
            if began < invalidated_at:
                calls_before += 1
                slow_before += slow
            else:
                calls_after += 1
                slow_after += slow
                worst_after = max(worst_after, latency)
        for key, started, finished in report["rebuilt"]:
            if started >= invalidated_at:
                fresh_at[key] = min(fresh_at.get(key, math.inf), finished)
        events.update(report["events"])
        errors += report["errors"]
    all_fresh = max(fresh_at.values()) - invalidated_at if len(fresh_at) == entries else math.nan
    return TagResult(
        case=case,
        quiet=quiet,
        rebuilds=rebuilds,
        entries=entries,
        calls_before=calls_before,
        slow_before=slow_before,
        calls_after=calls_after,
        slow_after=slow_after,
        worst_after=worst_after,
        window=window,
        events=events,
        fresh=len(fresh_at),
        all_fresh=all_fresh,
        errors=errors,
    )


def share(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "n/a"


#: The two ways the readers walk the group: (spread, the section's title, what it means).
LAYOUTS = (
    (True, "1b", "each caller starts at its own entry", "the callers start spread evenly over the list"),
    (
        False,
        "1c",
        "every caller walks the entries in the same order",
        "every caller starts at the first entry, as the readers of one page listing the group would",
    ),
)


def tag_sections(spread: Sequence[TagResult], same: Sequence[TagResult], scale: Scale) -> list[Section]:
    quiet = Section(
        title=f"1a. The invalidation itself: a group of {scale.entries} cached entries, quiet server",
        intro=(
            "Commands as `MONITOR` sees them: sent by the client, and run inside server-side scripts "
            "(which `INFO`'s command counts include on this Redis); the call's wall time."
        ),
        table=Table(
            headers=["case", "commands sent", "which", "run inside scripts", "call time"],
            rows=[
                [
                    result.case.label,
                    str(sum(result.quiet.tally.sent.values())),
                    result.quiet.tally.names(),
                    str(sum(result.quiet.tally.scripted.values())),
                    millis(result.quiet.seconds),
                ]
                for result in spread
            ],
            align="lrlrr",
        ),
        notes=(
            "stampede's `invalidate_tags` and `delete_tags` bump the tag's state key, one script whatever "
            "the group's size; entries carry the versions of their tags and are judged when read. "
            "cashews' `delete_tags` is a hard delete: it pops the tag's set of keys 100 at a time "
            "(`SPOP`), deletes them (`UNLINK`), and removes them from the tag's set again (`SREM`, its "
            "on-remove callback): its commands grow with the group.",
        ),
    )
    return [
        quiet,
        *(
            load_section(results, layout, scale)
            for results, layout in zip((spread, same), LAYOUTS, strict=True)
        ),
    ]


def load_section(results: Sequence[TagResult], layout: tuple[bool, str, str, str], scale: Scale) -> Section:
    spread, number, title, how = layout
    callers = f"{scale.processes} processes x {scale.tasks} asyncio tasks"
    notes: tuple[str, ...] = ()
    if not spread:
        notes = (
            "A hard invalidation (stampede's `delete_tags`, cashews' `delete_tags`) leaves nothing to "
            "serve: a reader of a deleted entry rebuilds it or waits. stampede's soft one serves the "
            "stale value while one caller per entry refreshes it (that caller waits for its rebuild, "
            "unless `background=True`, where each process runs at most `background_workers` (4) "
            "refreshes at once).",
            "cashews `@cache` has no lock across processes: each process whose readers miss an entry "
            "rebuilds it (its own readers share the one task). With `lock=True` every call, hits too, "
            "takes the entry's lock (`SET NX`) and releases it (a script), and a caller that finds it "
            "taken retries at once.",
            "cashews' delete is not atomic with rebuilds: a rebuild that read its data before the "
            "delete and stores after it keeps the old value until its TTL (none is under way here, as "
            "every entry is warm); stampede's versions make such a value stale at once.",
        )
    return Section(
        title=f"{number}. A group invalidated under load, {title}: {scale.entries} entries, {callers}",
        intro=(
            f"Every caller reads every entry in turn, with a {millis(THINK)} pause between calls; {how}. "
            f"The group is invalidated once, {scale.before:g} s into the load, and the load goes on "
            "until Redis holds a rebuilt value of every entry (polled 4 times a second), for "
            f"{scale.after_min:g} s at least, {scale.after_max:g} s at most. A rebuild takes "
            f"{millis(REBUILD)}; a call over {millis(SLOW)} waited for one (its own or another's); "
            "before: the same share before the invalidation, the machine's noise. Stale served, misses, "
            "waits: stampede's own events (`on_event`). Every entry fresh: from the invalidation to the "
            "end of the first rebuild begun after it, of the last entry to get one (readers see a soft "
            f"invalidation within `tag_check_interval`, {TAG_CHECK:g} s)."
        ),
        table=Table(
            headers=[
                "case",
                "rebuilds per entry",
                "calls after (in)",
                f"> {millis(SLOW)} after",
                f"> {millis(SLOW)} before",
                "slowest after",
                "stale served / misses / waits",
                "every entry fresh after",
                "errors",
            ],
            rows=[tag_row(result) for result in results],
            align="lrrrrrrrr",
        ),
        notes=notes,
    )


def tag_row(result: TagResult) -> list[str]:
    if result.case.library == "stampede":
        events = result.events
        counts = f"{events['stale_hit']} / {events['miss']} / {events['wait']}"
    else:
        counts = "n/a"
    fresh = (
        millis(result.all_fresh)
        if not math.isnan(result.all_fresh)
        else f"not all ({result.fresh} of {result.entries})"
    )
    return [
        result.case.label,
        f"{result.rebuilds / result.entries:.2f}",
        f"{result.calls_after} ({result.window:.1f} s)",
        f"{result.slow_after} ({share(result.slow_after, result.calls_after)})",
        share(result.slow_before, result.calls_before),
        millis(result.worst_after),
        counts,
        fresh,
        str(result.errors),
    ]
