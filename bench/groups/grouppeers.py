"""Groups (tags) and batches beside their closest peers, in one run, on one redis-server.

``python -m bench grouppeers [--quick]`` starts its own redis-server
(:class:`stampede.testing.RedisServer`) and runs every case on it, one after
another, the server flushed between cases. Worker processes are spawned
(``multiprocessing``'s ``spawn``); rebuilds are counted in Redis (``INCR`` of a
counter key), so that processes add up. Commands are counted with ``MONITOR``
on an otherwise idle server: those the client sent, and apart from them
those run inside server-side scripts (``INFO``'s ``total_commands_processed``
counts both on this Redis, so it cannot tell them apart).

1. A group invalidated under load. N entries (200; 40 with ``--quick``), each
   tagged ``group``, are cached; then P processes x T asyncio tasks (4 x 8;
   2 x 8 with ``--quick``) read every entry in turn, in a loop, with a 5 ms
   pause between calls, and the group is invalidated once, from this
   process, 1 s into the load (0.5 s with ``--quick``). The load goes on
   until Redis holds a rebuilt value of every entry (at least 1.5 s, at most
   25 s; 1 s and 10 s with ``--quick``). It runs twice: with the callers
   starting spread evenly over the entries (an entry is rarely read by two
   at once), and with every caller walking them in the same order from the
   first (the readers of one page that lists the group: they meet on each
   entry). The readers are asyncio tasks for both libraries, as cashews has
   no blocking API: stampede as ``stampede.asyncio.Stampede``
   (``tag_check_interval=0.1``) with ``invalidate_tags`` (soft), the same with
   ``background=True``, and ``delete_tags`` (hard); cashews as
   ``@cache(ttl=..., key=..., tags=["group"])`` (its default ``protected=True``
   makes one process's calls of a key share one task), and the same with
   ``lock=True`` (its lock across processes), both invalidated with
   ``delete_tags("group")``, the only group invalidation cashews has. A
   rebuild INCRs the counter and sleeps 50 ms. Reported: rebuilds per entry
   (ideal 1.0); the calls made after the invalidation, and how many took
   over 25 ms (they waited for a rebuild, their own or another caller's; the
   share before the invalidation is the machine's noise); stampede's own
   counts of stale values served, misses and waits (``on_event``); the time
   from the invalidation to the end of the first rebuild begun after it, for
   the last entry to get one. Apart, on the quiet server just before the
   load (the N entries cached, the same invalidation once): the commands it
   sent, those run inside scripts, and the call's wall time.
2. A cold batch. P processes (8; 4 with ``--quick``), lined up on a barrier,
   ask at once for the same 100 missing keys, once per round (3; 1 with
   ``--quick``, new keys each round): ``Stampede.get_or_rebuild_many``
   against dogpile.cache's ``region.get_or_create_multi`` on its
   ``dogpile.cache.redis`` backend with ``distributed_lock=True`` (and
   ``thread_local_lock=False``, as its docs ask; Redis keeps a value 600 s past
   dogpile's expiration time, as its docs advise, so that an expired one can
   be served while one caller regenerates). Both blocking, one caller per
   process; the batch rebuild INCRBYs the counter by the number of keys it
   is given, then sleeps 50 ms (one query for the batch). Reported: rebuilds
   per key (ideal 1.0), the callers that rebuilt anything, the slowest
   caller. Then a warm batch of 100 keys in this process: commands per batch
   call, and CPU microseconds per call in this process
   (``time.process_time``, best of 3 blocks), beside a plain ``MGET`` and
   unpickling as the floor.
3. A warm tagged hit: CPU microseconds and commands per hit, in this
   process, for ``stampede.asyncio``'s ``get_or_rebuild`` (untagged and
   tagged) and cashews' ``@cache(tags=...)`` (without and with ``lock=True``).

Every number comes from the same run on the same machine: read them as
ratios side by side. Nothing is asserted about wall-clock times.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import dataclasses
import functools
import math
import multiprocessing
import os
import pickle
import queue
import statistics
import sys
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.context import SpawnContext, SpawnProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from multiprocessing.synchronize import Event as ProcessEvent
from typing import Any, cast

import redis
import redis.asyncio

import stampede
import stampede.asyncio
from stampede.testing import RedisServer

from .._common.report import Section, Table, environment_line, millis, render_section
from .._common.workload import make_value

__all__ = ["main"]

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
#: Seconds a lock (dogpile) lives if its holder dies: stampede's default ``lease_ttl``.
LOCK_TIMEOUT = 5
#: Socket timeout of every client: long, so that a loaded machine does not turn into errors.
SOCKET_TIMEOUT = 30.0
#: Seconds to wait for workers to start, to report, to exit.
START_TIMEOUT = 120.0
REPORT_TIMEOUT = 60.0
JOIN_TIMEOUT = 15.0

AsyncRebuild = Callable[[], Awaitable[Any]]
BatchRebuild = Callable[[list[str]], dict[str, Any]]
Message = tuple[str, int, Any]


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


# --- counting commands ---------------------------------------------------------


@dataclass
class Tally:
    """Commands seen by ``MONITOR``, by name: sent by clients, and run inside scripts."""

    sent: Counter[str] = dataclasses.field(default_factory=Counter)
    scripted: Counter[str] = dataclasses.field(default_factory=Counter)

    def names(self) -> str:
        """``"SPOP 3, UNLINK 2"``: the commands sent, most frequent first."""
        return ", ".join(f"{name} {count}" for name, count in self.sent.most_common()) or "none"


@contextlib.contextmanager
def monitored(url: str) -> Iterator[Tally]:
    """Count the commands the server receives while the body runs (nothing else may use it)."""
    tally = Tally()
    client = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT)
    # The end marker's client, connected now: its connection's handshake is not counted.
    ender = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT)
    marker = f"grouppeers-monitor-end-{os.getpid()}-{time.monotonic_ns()}"
    try:
        ender.ping()
        with client.monitor() as monitor:  # type: ignore[no-untyped-call]
            yield tally
            ender.echo(marker)  # every command the body sent is before it in the stream
            while True:
                raw = monitor.connection.read_response()
                line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
                if marker in line:
                    break
                # 1700000000.123456 [0 127.0.0.1:40000] "GET" "key"   (or [0 lua] inside a script)
                head, _, command = line.partition("] ")
                source = head.rsplit(" ", 1)[-1]
                name = command.split('"')[1].upper() if command.count('"') >= 2 else "?"
                (tally.scripted if source == "lua" else tally.sent)[name] += 1
    finally:
        client.close()
        ender.close()


# --- scenario 1: a group invalidated under load -------------------------------


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


class Tagged:
    """One library's tagged read and group invalidation, on the running event loop."""

    async def read(self, key: str, rebuild: AsyncRebuild) -> Any:
        raise NotImplementedError

    async def invalidate(self, tag: str) -> None:
        raise NotImplementedError

    async def stored(self, keys: Sequence[str]) -> list[Any]:
        """The values stored under ``keys`` (``None`` where there is none), read in one go, rebuilding
        nothing."""
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError


class StampedeTagged(Tagged):
    def __init__(
        self,
        url: str,
        *,
        hard: bool,
        background: bool,
        tags: tuple[str, ...] = (TAG,),
        on_event: stampede.EventHook | None = None,
    ) -> None:
        self.client = redis.asyncio.Redis.from_url(
            url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=10.0
        )
        self.sf = stampede.asyncio.Stampede(
            self.client, namespace=NAMESPACE, tag_check_interval=TAG_CHECK, on_event=on_event
        )
        self.hard = hard
        self.options: dict[str, Any] = {"ttl": TTL, "stale_ttl": STALE_TTL, "tags": tags}
        if background:
            self.options["background"] = True

    async def read(self, key: str, rebuild: AsyncRebuild) -> Any:
        return await self.sf.get_or_rebuild(key, rebuild, **self.options)

    async def invalidate(self, tag: str) -> None:
        if self.hard:
            await self.sf.delete_tags(tag)
        else:
            await self.sf.invalidate_tags(tag)

    async def stored(self, keys: Sequence[str]) -> list[Any]:
        found = await self.sf.get_many(keys)
        return [found.get(key) for key in keys]

    async def aclose(self) -> None:
        await self.sf.aclose()  # waits for background refreshes
        await self.client.aclose()


#: The cashews key of an entry (the decorated function's key template).
CASHEWS_KEY = "gp:{key}"


async def cashews_compute(key: str, rebuild: AsyncRebuild) -> Any:
    """What the cashews-decorated function computes: the caller's rebuild (not part of the key)."""
    return await rebuild()


class CashewsTagged(Tagged):
    def __init__(self, url: str, *, lock: bool, connections: int, tags: tuple[str, ...] = (TAG,)) -> None:
        from cashews import Cache

        self.cache = Cache()
        self.cache.setup(url, suppress=False, socket_timeout=SOCKET_TIMEOUT, max_connections=connections)
        # Registers each tag for the key template, as the decorator does for every tag it is given.
        decorate = self.cache(ttl=TTL, key=CASHEWS_KEY, tags=list(tags), lock=lock)
        self.cached: Callable[..., Awaitable[Any]] = decorate(cashews_compute)

    async def read(self, key: str, rebuild: AsyncRebuild) -> Any:
        return await self.cached(key=key, rebuild=rebuild)

    async def invalidate(self, tag: str) -> None:
        await self.cache.delete_tags(tag)

    async def stored(self, keys: Sequence[str]) -> list[Any]:
        return list(await self.cache.get_many(*(CASHEWS_KEY.format(key=key) for key in keys)))

    async def aclose(self) -> None:
        await self.cache.close()


def open_tagged(
    case: TagCase, url: str, *, connections: int, on_event: stampede.EventHook | None = None
) -> Tagged:
    if case.library == "stampede":
        return StampedeTagged(url, hard=case.hard, background=case.background, on_event=on_event)
    return CashewsTagged(url, lock=case.lock, connections=connections)


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


def entry_keys(entries: int) -> list[str]:
    return [f"e{i}" for i in range(entries)]


#: stampede's events counted by the readers.
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


def expect(
    out: Queue[Message], processes: Sequence[SpawnProcess], kind: str, count: int, timeout: float
) -> list[Any]:
    """``count`` messages of ``kind`` from the workers; a worker's error or death raises."""
    deadline = time.monotonic() + timeout
    found: list[Any] = []
    while len(found) < count:
        try:
            what, index, payload = out.get(timeout=0.5)
        except queue.Empty:
            dead = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a worker exited with {dead[0]} before sending {kind!r}") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(found)} of {count} workers sent {kind!r}") from None
            continue
        if what == "error":
            raise RuntimeError(f"worker {index} failed:\n{payload}")
        if what == kind:
            found.append(payload)
    return found


def finish(processes: Sequence[SpawnProcess]) -> None:
    for process in processes:
        process.join(JOIN_TIMEOUT)
    for process in processes:
        if process.is_alive():
            process.terminate()
            process.join(JOIN_TIMEOUT)


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


# --- scenario 2: batches -------------------------------------------------------


class Batch:
    """One library's batch read, blocking."""

    def get_many(self, keys: list[str], rebuild_many: BatchRebuild) -> dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class StampedeBatch(Batch):
    def __init__(self, url: str, tags: tuple[str, ...] = ()) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=10.0)
        self.sf = stampede.Stampede(self.client, namespace=NAMESPACE, tag_check_interval=TAG_CHECK)
        self.tags = tags

    def get_many(self, keys: list[str], rebuild_many: BatchRebuild) -> dict[str, Any]:
        return self.sf.get_or_rebuild_many(keys, rebuild_many, ttl=TTL, stale_ttl=STALE_TTL, tags=self.tags)

    def close(self) -> None:
        self.sf.close()
        self.client.close()


class DogpileBatch(Batch):
    def __init__(self, url: str) -> None:
        from dogpile.cache import make_region

        self.pool = redis.ConnectionPool.from_url(
            url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=10.0
        )
        self.region = make_region().configure(
            "dogpile.cache.redis",
            expiration_time=TTL,
            arguments={
                "connection_pool": self.pool,
                "redis_expiration_time": TTL + STALE_TTL,
                "distributed_lock": True,
                "thread_local_lock": False,
                "lock_timeout": LOCK_TIMEOUT,
            },
        )

    def get_many(self, keys: list[str], rebuild_many: BatchRebuild) -> dict[str, Any]:
        def creator(*asked: str) -> list[Any]:
            built = rebuild_many(list(asked))
            return [built[key] for key in asked]

        return dict(zip(keys, self.region.get_or_create_multi(keys, creator), strict=True))

    def close(self) -> None:
        self.pool.disconnect()


class PlainBatch(Batch):
    """Cache-aside on one ``MGET``, values pickled: no protection at all, the floor of a warm batch."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=10.0)

    def get_many(self, keys: list[str], rebuild_many: BatchRebuild) -> dict[str, Any]:
        raws = cast("list[bytes | None]", self.client.mget(keys))
        found = {key: pickle.loads(raw) for key, raw in zip(keys, raws, strict=True) if raw is not None}
        missing = [key for key in keys if key not in found]
        if missing:
            built = rebuild_many(missing)
            pipe = self.client.pipeline(transaction=False)
            for key, value in built.items():
                pipe.set(key, pickle.dumps(value, pickle.HIGHEST_PROTOCOL), ex=TTL)
            pipe.execute()
            found.update(built)
        return found

    def close(self) -> None:
        self.client.close()


def open_batch(library: str, url: str) -> Batch:
    if library == "stampede":
        return StampedeBatch(url)
    if library == "stampede-tagged":
        return StampedeBatch(url, tags=(TAG,))
    if library == "dogpile":
        return DogpileBatch(url)
    if library == "plain":
        return PlainBatch(url)
    raise KeyError(library)


BATCH_LABELS = {
    "stampede": "stampede `get_or_rebuild_many`",
    "stampede-tagged": "stampede `get_or_rebuild_many`, `tags=('group',)`",
    "dogpile": "dogpile.cache `get_or_create_multi`, `distributed_lock=True`",
    "plain": "plain `MGET` + unpickle (no protection: the floor)",
}


def batch_keys(library: str, round_: int) -> list[str]:
    return [f"{library}:r{round_}:k{i}" for i in range(BATCH)]


def round_counter(library: str, round_: int) -> str:
    """Where one round's rebuilds are counted: a key per round, as the workers may start the next
    round before this process has read the last one's count."""
    return f"{COUNTER}:{library}:r{round_}"


def batch_rebuilder(client: redis.Redis, counter: str, asked_for: list[int]) -> BatchRebuild:
    """The batch's slow query: counted in Redis under ``counter``, one sleep for the batch;
    ``asked_for`` gets the size of each batch it is asked for."""

    def rebuild_many(keys: list[str]) -> dict[str, Any]:
        client.incrby(counter, len(keys))
        asked_for.append(len(keys))
        time.sleep(REBUILD)
        return {key: {"key": key, **make_value()} for key in keys}

    return rebuild_many


def batch_caller(
    library: str, url: str, rounds: int, index: int, barrier: Barrier, out: Queue[Message]
) -> None:
    """Worker process: each round, ask for the round's cold batch at the same moment as the others."""
    try:
        batch = open_batch(library, url)
        client = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT)
        try:
            client.ping()
            # Connect and load what the library loads on first use (counted apart).
            batch.get_many([f"{library}:connect"], batch_rebuilder(client, f"{COUNTER}:connect", []))
            for round_ in range(rounds):
                keys = batch_keys(library, round_)
                asked_for: list[int] = []
                rebuild_many = batch_rebuilder(client, round_counter(library, round_), asked_for)
                barrier.wait(START_TIMEOUT)
                began = time.perf_counter()
                values = batch.get_many(keys, rebuild_many)
                took = time.perf_counter() - began
                wrong = sum(1 for key in keys if values.get(key, {}).get("key") != key)
                out.put(("round", index, (round_, took, sum(asked_for), wrong)))
        finally:
            batch.close()
            client.close()
    except BaseException:
        out.put(("error", index, traceback.format_exc()))
        raise


@dataclass(frozen=True)
class ColdResult:
    library: str
    per_key: list[float]  # rebuilds per key, by round
    rebuilders: list[int]  # callers that rebuilt anything, by round
    slowest: list[float]  # the slowest caller's seconds, by round
    wrong: int


def run_cold_batch(library: str, url: str, scale: Scale, context: SpawnContext) -> ColdResult:
    admin = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT)
    admin.flushall()
    out: Queue[Message] = context.Queue()
    barrier = context.Barrier(scale.batch_processes)
    processes = [
        context.Process(target=batch_caller, args=(library, url, scale.rounds, i, barrier, out), daemon=True)
        for i in range(scale.batch_processes)
    ]
    per_key: list[float] = []
    rebuilders: list[int] = []
    slowest: list[float] = []
    wrong = 0
    try:
        for process in processes:
            process.start()
        for round_ in range(scale.rounds):
            done = expect(out, processes, "round", len(processes), START_TIMEOUT + REPORT_TIMEOUT)
            if any(reported[0] != round_ for reported in done):
                raise RuntimeError("the workers' rounds got out of step")
            per_key.append(int(admin.get(round_counter(library, round_)) or 0) / BATCH)
            rebuilders.append(sum(1 for _, _, rebuilt, _ in done if rebuilt))
            slowest.append(max(took for _, took, _, _ in done))
            wrong += sum(bad for _, _, _, bad in done)
    finally:
        barrier.abort()
        finish(processes)
        admin.close()
    return ColdResult(library, per_key, rebuilders, slowest, wrong)


@dataclass(frozen=True)
class Cost:
    label: str
    sent: float  # commands sent per call
    scripted: float  # commands run inside scripts per call
    names: str
    cpu: float  # seconds of this process's CPU per call


def warm_batch_cost(library: str, url: str, scale: Scale) -> Cost:
    batch = open_batch(library, url)
    client = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT)
    keys = [f"warm:{library}:k{i}" for i in range(BATCH)]
    rebuild_many = batch_rebuilder(client, COUNTER, [])
    try:
        for _ in range(20):  # stored, then read warm: connections open, tag states read
            batch.get_many(keys, rebuild_many)
        with monitored(url) as tally:
            for _ in range(scale.batch_calls):
                batch.get_many(keys, rebuild_many)
        best = math.inf
        for _ in range(3):
            began = time.process_time()
            for _ in range(scale.batch_calls):
                batch.get_many(keys, rebuild_many)
            best = min(best, (time.process_time() - began) / scale.batch_calls)
    finally:
        batch.close()
        client.close()
    calls = scale.batch_calls
    return Cost(
        BATCH_LABELS[library],
        sum(tally.sent.values()) / calls,
        sum(tally.scripted.values()) / calls,
        tally.names(),
        best,
    )


def batch_sections(cold: Sequence[ColdResult], warm: Sequence[Cost], scale: Scale) -> list[Section]:
    rounds = scale.rounds
    cold_section = Section(
        title=f"2a. {scale.batch_processes} processes ask at once for the same {BATCH} cold keys",
        intro=(
            f"Lined up on a barrier; {rounds} round{'s' if rounds > 1 else ''}, new keys each round. The "
            f"batch rebuild takes {millis(REBUILD)} whatever its size. Rebuilds per key: counted in Redis "
            "(ideal 1.00); callers that rebuilt: how many of the processes' batch rebuilds ran with any key; "
            "slowest caller: until the last process had its batch (median of rounds)."
        ),
        table=Table(
            headers=[
                "library",
                "rebuilds per key (mean / worst)",
                "callers that rebuilt",
                "slowest caller",
                "wrong values",
            ],
            rows=[
                [
                    BATCH_LABELS[result.library],
                    f"{statistics.fmean(result.per_key):.2f} / {max(result.per_key):.2f}",
                    f"{statistics.fmean(result.rebuilders):.1f} of {scale.batch_processes}",
                    millis(statistics.median(result.slowest)),
                    str(result.wrong),
                ]
                for result in cold
            ],
            align="lrrrr",
        ),
        notes=(
            "dogpile's `get_or_create_multi` reads the batch once (`MGET`), then takes each missing key's "
            "lock in turn (sorted), blocking while another holds it (polling every `lock_sleep`, 0.1 s); "
            "it does not read a key again once it holds its lock, so a caller that waited for another's "
            "regeneration regenerates the key again.",
            "stampede's `get_or_rebuild_many` takes the leases it can in one script and calls "
            "`rebuild_many` with those keys only; it waits for the keys others hold, woken when they land.",
        ),
    )
    warm_section = Section(
        title=f"2b. A warm batch of {BATCH} keys, one process",
        intro=(
            f"Commands per call: `MONITOR` over {scale.batch_calls} calls (stampede also reads the "
            f"states of the namespace and tags it has not read in `tag_check_interval`, {TAG_CHECK:g} s). "
            f"CPU per call: this process's CPU time, best of 3 blocks of {scale.batch_calls} calls."
        ),
        table=Table(
            headers=[
                "library",
                "commands sent per call",
                "which (in all)",
                "run inside scripts per call",
                "CPU per call",
            ],
            rows=[
                [
                    cost.label,
                    f"{cost.sent:.2f}",
                    cost.names,
                    f"{cost.scripted:.2f}",
                    f"{cost.cpu * 1e6:.0f} µs",
                ]
                for cost in warm
            ],
            align="lrlrr",
        ),
    )
    return [cold_section, warm_section]


# --- scenario 3: a warm tagged hit ---------------------------------------------


HIT_CASES: tuple[tuple[str, Callable[[str], Tagged]], ...] = (
    (
        "stampede.asyncio `get_or_rebuild`, untagged",
        lambda url: StampedeTagged(url, hard=False, background=False, tags=()),
    ),
    (
        "stampede.asyncio `get_or_rebuild`, `tags=('group',)`",
        lambda url: StampedeTagged(url, hard=False, background=False),
    ),
    ("cashews `@cache(tags=['group'])`", lambda url: CashewsTagged(url, lock=False, connections=4)),
    ("cashews `@cache(tags=['group'], lock=True)`", lambda url: CashewsTagged(url, lock=True, connections=4)),
)


async def hit_cost(label: str, make: Callable[[str], Tagged], url: str, calls: int) -> Cost:
    tagged = make(url)  # on the running loop
    counter = redis.asyncio.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT)
    rebuild = functools.partial(rebuild_value, counter, "hit", 0.0)
    try:
        for _ in range(200):
            await tagged.read("hit", rebuild)
        measured = min(calls, 500)
        with monitored(url) as tally:
            for _ in range(measured):
                await tagged.read("hit", rebuild)
        best = math.inf
        for _ in range(3):
            began = time.process_time()
            for _ in range(calls):
                await tagged.read("hit", rebuild)
            best = min(best, (time.process_time() - began) / calls)
    finally:
        await tagged.aclose()
        await counter.aclose()
    return Cost(
        label,
        sum(tally.sent.values()) / measured,
        sum(tally.scripted.values()) / measured,
        tally.names(),
        best,
    )


def hit_section(costs: Sequence[Cost], scale: Scale) -> Section:
    return Section(
        title="3. A warm tagged hit, asyncio, one process",
        intro=(
            "One cached value (a dict of ten fields), read again and again by one task. Commands: "
            f"`MONITOR` over up to 500 calls; CPU: best of 3 blocks of {scale.hit_calls} calls."
        ),
        table=Table(
            headers=[
                "library",
                "commands sent per hit",
                "which (in all)",
                "run inside scripts per hit",
                "CPU per hit",
            ],
            rows=[
                [
                    cost.label,
                    f"{cost.sent:.2f}",
                    cost.names,
                    f"{cost.scripted:.2f}",
                    f"{cost.cpu * 1e6:.1f} µs",
                ]
                for cost in costs
            ],
            align="lrlrr",
        ),
    )


# --- the run ---------------------------------------------------------------------


def missing_peers() -> list[str]:
    missing = []
    for module, package in (("cashews", "cashews>=7.0"), ("dogpile.cache", "dogpile.cache>=1.3")):
        try:
            __import__(module)
        except ImportError:
            missing.append(package)
    return missing


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench grouppeers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer entries, processes and rounds (under 60 s)"
    )
    args = parser.parse_args(argv)
    missing = missing_peers()
    if missing:
        parser.exit(2, f"the peers are not installed: pip install {' '.join(repr(p) for p in missing)}\n")
    scale = QUICK if args.quick else FULL
    context = multiprocessing.get_context("spawn")
    sections: list[Section] = []
    with RedisServer() as server:
        url = server.url
        version = str(redis.Redis.from_url(url).info("server")["redis_version"])
        by_layout: dict[bool, list[TagResult]] = {True: [], False: []}
        for spread, *_ in LAYOUTS:
            for case in TAG_CASES:
                progress(f"groups: {case.name}, {'spread' if spread else 'same order'}")
                result = asyncio.run(run_tag_case(case, url, scale, context, spread=spread))
                by_layout[spread].append(result)
        sections.extend(tag_sections(by_layout[True], by_layout[False], scale))
        cold = []
        for library in ("stampede", "dogpile"):
            progress(f"cold batch: {library}")
            cold.append(run_cold_batch(library, url, scale, context))
        warm = []
        redis.Redis.from_url(url).flushall()
        for library in ("stampede", "stampede-tagged", "dogpile", "plain"):
            progress(f"warm batch: {library}")
            warm.append(warm_batch_cost(library, url, scale))
        sections.extend(batch_sections(cold, warm, scale))
        hits = []
        for label, make in HIT_CASES:
            progress(f"hit: {label}")
            hits.append(asyncio.run(hit_cost(label, make, url, scale.hit_calls)))
        sections.append(hit_section(hits, scale))
    print(environment_line(version, quick=args.quick))
    print()
    print("# stampede's groups and batches beside their peers")
    for section in sections:
        print()
        print(render_section(section))
