"""``python -m bench storm``: a database that keeps failing, under one key that everyone wants.

4 worker processes of 16 threads each call get-or-rebuild on the same key for the whole run (10 s),
through a "database" whose queries raise for the first 6 s and then succeed; a query takes 50 ms
either way. The database needs no Redis and no messages: every process is given the run's start
time, and a query begun before ``start + seconds_down`` fails. Two cases: ``hot``, the key holds a
stale value when the run begins; ``cold``, nothing is stored.

The libraries, side by side, each on a fresh redis-server of its own: stampede's
``Stampede.get_or_rebuild`` (which records a failed rebuild under the key's lease and lets nobody
try again for a back-off of 0.5 s doubling to 10 s) and dogpile.cache's ``get_or_create`` on its
Redis backend with ``distributed_lock=True``, as :mod:`bench.peers.dogpile` configures it (if
installed).

Per case and library: rebuild attempts per second while the database is down (every process
appends the attempt's start time to one file), the most in any one second, the calls made while
it is down, those served a value (stale or fresh) and those that raised (by kind), the calls that
still raised once it was back, the median, slowest 1% and slowest call, and how soon after the
database was back the first value was stored.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import logging
import math
import multiprocessing
import os
import struct
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event as ProcessEvent
from typing import Any, Literal

import stampede
from stampede.testing import RedisServer

from .._common import servers
from .._common.installed import importable
from .._common.report import Section, Table, environment_line, progress, render_section
from .._common.stats import percentile
from .._common.workload import make_value
from ..groups._processes import REPORT_TIMEOUT, START_TIMEOUT, Message, expect, finish

__all__ = ["CASES", "LIBRARIES", "Library", "Outcome", "Plan", "main", "run"]

Case = Literal["hot", "cold"]
CASES: tuple[Case, ...] = ("hot", "cold")
PROCESSES = 4
THREADS = 16
KEY = "storm"
NAMESPACE = "storm"
#: How long a query takes, failing or not.
QUERY_SECONDS = 0.05
#: Seconds a rebuilt value stays fresh: longer than a run, so the first value stored ends the storm.
TTL = 60
#: Seconds a value is kept once stale: the hot case's stale value outlives any run.
STALE_TTL = 3600
#: The hot case's value is stored fresh for this long before the run, and stale after.
STALE_AFTER = 0.5
#: Seconds between telling the workers when the run starts and that moment: every thread is
#: asleep until it by then.
START_LEAD = 0.5
#: One rebuild attempt in the attempts file: the wall-clock time it began.
ATTEMPT = struct.Struct("<d")

Call = Callable[[], Any]
Rebuild = Callable[[], dict[str, Any]]


@dataclass(frozen=True)
class Plan:
    """How long a run lasts and, from its start, how long the database is down (seconds)."""

    seconds: float = 10.0
    seconds_down: float = 6.0

    def halved(self) -> Plan:
        return Plan(self.seconds / 2, self.seconds_down / 2)


class DatabaseDown(Exception):
    """What a query raises while the database is down."""


# --- the libraries ---------------------------------------------------------------------------


def _open_stampede(url: str, case: Case, rebuild: Rebuild) -> tuple[Call, Callable[[], None]]:
    cache = stampede.Stampede.from_url(url, namespace=NAMESPACE)
    call = functools.partial(cache.get_or_rebuild, KEY, rebuild, ttl=TTL, stale_ttl=STALE_TTL)
    return call, cache.close


def _stale_stampede(url: str, value: dict[str, Any]) -> float:
    cache = stampede.Stampede.from_url(url, namespace=NAMESPACE)
    try:
        cache.set(KEY, value, ttl=STALE_AFTER, stale_ttl=STALE_TTL)
    finally:
        cache.close()
    return time.time() + STALE_AFTER


def _open_dogpile(url: str, case: Case, rebuild: Rebuild) -> tuple[Call, Callable[[], None]]:
    from ..peers.dogpile import pool, region

    connections = pool(url)
    chosen = region(connections, TTL, STALE_TTL)
    if case == "hot":
        # dogpile decides freshness in the reading process, from its region's expiration_time:
        # a soft invalidation is its own way to make what is stored stale (served while one
        # caller regenerates), as an expiration_time passed since the parent's set would.
        chosen.invalidate(hard=False)
    return functools.partial(chosen.get_or_create, KEY, rebuild), connections.disconnect


def _stale_dogpile(url: str, value: dict[str, Any]) -> float:
    from ..peers.dogpile import pool, region

    connections = pool(url)
    try:
        region(connections, TTL, STALE_TTL).set(KEY, value)
    finally:
        connections.disconnect()
    return time.time()  # stale once the workers have invalidated their regions, before they start


@dataclass(frozen=True)
class Library:
    """A library the storm runs: its label, what it needs, how a worker opens it on a Redis URL
    (a call, and what closes it), and how the parent stores the hot case's stale value (it
    returns the wall-clock time from which that value is stale)."""

    name: str
    label: str
    modules: tuple[str, ...]
    distribution: str
    open: Callable[[str, Case, Rebuild], tuple[Call, Callable[[], None]]]
    stale: Callable[[str, dict[str, Any]], float]

    def missing(self) -> list[str]:
        return [module for module in self.modules if not importable(module)]


LIBRARIES: tuple[Library, ...] = (
    Library(
        "stampede",
        "stampede `get_or_rebuild`",
        ("redis",),
        "redis-stampede",
        _open_stampede,
        _stale_stampede,
    ),
    Library(
        "dogpile",
        "dogpile.cache `get_or_create`, `distributed_lock=True`",
        ("dogpile.cache", "redis"),
        "dogpile.cache",
        _open_dogpile,
        _stale_dogpile,
    ),
)
BY_NAME = {library.name: library for library in LIBRARIES}


# --- the worker processes --------------------------------------------------------------------


@dataclass
class Tally:
    """What the calls of a thread, a worker, then a run got. A call counts as ``down`` if it
    began while the database was down, else as ``back``."""

    durations: list[float] = field(default_factory=list)
    calls_down: int = 0
    served_down: int = 0
    raised_down: Counter[str] = field(default_factory=Counter)
    calls_back: int = 0
    served_back: int = 0
    raised_back: Counter[str] = field(default_factory=Counter)
    #: When the first call to return a value built after the database came back returned
    #: (wall clock): the value was stored just before.
    first_fresh: float = math.inf

    def record(self, began: float, took: float, value: Any, error: str | None, back_at: float) -> None:
        self.durations.append(took)
        down = began < back_at
        if error is not None:
            (self.raised_down if down else self.raised_back)[error] += 1
        elif down:
            self.served_down += 1
        else:
            self.served_back += 1
        if down:
            self.calls_down += 1
        else:
            self.calls_back += 1
        if error is None and value["built_at"] >= back_at:
            self.first_fresh = min(self.first_fresh, began + took)

    def absorb(self, other: Tally) -> None:
        self.durations += other.durations
        self.calls_down += other.calls_down
        self.served_down += other.served_down
        self.raised_down += other.raised_down
        self.calls_back += other.calls_back
        self.served_back += other.served_back
        self.raised_back += other.raised_back
        self.first_fresh = min(self.first_fresh, other.first_fresh)


def worker_main(
    library: str,
    case: Case,
    url: str,
    plan: Plan,
    attempts_path: str,
    index: int,
    clock: Sequence[float],
    go: ProcessEvent,
    out: Queue[Message],
) -> None:
    """Entry point of a worker process: open the library, say ready, and once told to go, run
    :data:`THREADS` callers from ``clock[0]`` (the run's start, wall clock) for ``plan.seconds``;
    then send what they got."""
    # A rebuild that raised while a stale value was served is logged with its traceback, once
    # per attempt: the run counts attempts, the log would only bury the progress lines.
    logging.getLogger("stampede").setLevel(logging.ERROR)
    try:
        attempts = os.open(attempts_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        back_at = math.inf  # known once the parent says when the run starts

        def query() -> dict[str, Any]:
            began = time.time()
            # One write with O_APPEND: the processes' records never interleave.
            os.write(attempts, ATTEMPT.pack(began))
            time.sleep(QUERY_SECONDS)
            if began < back_at:
                raise DatabaseDown(f"the database is down for {back_at - began:.2f} s more")
            return {**make_value(), "built_at": began}

        call, close = BY_NAME[library].open(url, case, query)
        try:
            out.put(("ready", index, None))
            if not go.wait(START_TIMEOUT) or clock[0] == 0.0:
                return  # the parent gave up before the start
            start = clock[0]
            back_at = start + plan.seconds_down
            tallies = [Tally() for _ in range(THREADS)]
            threads = [
                threading.Thread(
                    target=_caller,
                    args=(call, tally, start, start + plan.seconds, back_at),
                    name=f"bench-storm-{index}.{n}",
                    daemon=True,
                )
                for n, tally in enumerate(tallies)
            ]
            for thread in threads:
                thread.start()
            deadline = start + plan.seconds + REPORT_TIMEOUT / 2
            for thread in threads:
                thread.join(max(0.0, deadline - time.time()))
            total = Tally()
            for tally in tallies:
                total.absorb(tally)
            out.put(("report", index, total))
        finally:
            close()
            os.close(attempts)
    except BaseException:
        out.put(("error", index, traceback.format_exc()))
        raise


def _caller(call: Call, tally: Tally, start: float, end: float, back_at: float) -> None:
    """One thread: calls one after another from ``start`` until ``end``, each timed."""
    time.sleep(max(0.0, start - time.time()))
    while (began := time.time()) < end:
        clock = time.perf_counter()
        value: Any = None
        error: str | None = None
        try:
            value = call()
        except Exception as exc:  # counted, and the loop goes on, as a request handler's would
            error = type(exc).__name__
        tally.record(began, time.perf_counter() - clock, value, error, back_at)


# --- the parent ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """One library's run of one case: what its callers got, when each rebuild attempt began
    (seconds from the run's start), and how long after the database was back the first value
    built since was stored (``inf``: none in the run)."""

    library: Library
    case: Case
    plan: Plan
    calls: Tally
    attempts: list[float]
    first_value: float

    @property
    def attempts_down(self) -> list[float]:
        return [at for at in self.attempts if at < self.plan.seconds_down]

    def busiest_second(self) -> int:
        """The most attempts begun within any one second while the database was down."""
        times = self.attempts_down
        most = first = 0
        for last, at in enumerate(times):
            while times[first] <= at - 1.0:
                first += 1
            most = max(most, last - first + 1)
        return most


def run(library: Library, case: Case, plan: Plan) -> Outcome:
    """One storm: a fresh redis-server, :data:`PROCESSES` workers, the calls of every one."""
    context = multiprocessing.get_context("spawn")
    with RedisServer() as server, tempfile.TemporaryDirectory(prefix="bench-storm-") as folder:
        attempts_path = os.path.join(folder, "attempts")
        stale_from = library.stale(server.url, {**make_value(), "built_at": 0.0}) if case == "hot" else 0.0
        out: Queue[Message] = context.Queue()
        go = context.Event()
        clock = context.Array("d", 1, lock=False)
        processes = [
            context.Process(
                target=worker_main,
                args=(library.name, case, server.url, plan, attempts_path, index, clock, go, out),
                name=f"bench-storm-{index}",
                daemon=True,
            )
            for index in range(PROCESSES)
        ]
        try:
            for process in processes:
                process.start()
            expect(out, processes, "ready", PROCESSES, START_TIMEOUT)
            start = max(time.time() + START_LEAD, stale_from)
            clock[0] = start
            go.set()
            reports = expect(out, processes, "report", PROCESSES, plan.seconds + START_LEAD + REPORT_TIMEOUT)
        finally:
            go.set()  # a worker still waiting finds no start time, and leaves
            finish(processes)
        calls = Tally()
        for report in reports:
            calls.absorb(report)
        with open(attempts_path, "rb") as file:
            began = sorted(at - start for (at,) in ATTEMPT.iter_unpack(file.read()))
    return Outcome(library, case, plan, calls, began, calls.first_fresh - (start + plan.seconds_down))


# --- the report ------------------------------------------------------------------------------


def _seconds(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _kinds(raised: Counter[str]) -> str:
    return ", ".join(f"{count} x {name}" for name, count in raised.most_common()) or "-"


HEADERS = [
    "library",
    "attempts/s down (all)",
    "most in 1 s",
    "calls down",
    "served down",
    "raised down",
    "raised down, by kind",
    "raised once back",
    "p50",
    "p99",
    "max",
    "first value after back",
]


def row(outcome: Outcome) -> list[str]:
    calls, plan = outcome.calls, outcome.plan
    down = len(outcome.attempts_down)
    return [
        outcome.library.label,
        f"{down / plan.seconds_down:.1f} ({down})",
        str(outcome.busiest_second()),
        str(calls.calls_down),
        str(calls.served_down),
        str(sum(calls.raised_down.values())),
        _kinds(calls.raised_down),
        str(sum(calls.raised_back.values())),
        _seconds(percentile(calls.durations, 50)),
        _seconds(percentile(calls.durations, 99)),
        _seconds(max(calls.durations, default=math.nan)),
        "none" if math.isinf(outcome.first_value) else f"{outcome.first_value:.2f} s",
    ]


def describe(outcome: Outcome) -> str:
    """A line of progress: the figures a reader looks at first."""
    calls = outcome.calls
    return (
        f"{len(outcome.attempts_down)} attempts while down, {calls.calls_down} calls "
        f"({sum(calls.raised_down.values())} raised), first value "
        + ("none" if math.isinf(outcome.first_value) else f"{outcome.first_value:.2f} s after back")
    )


def _versions(libraries: Sequence[Library]) -> str:
    found = []
    for name in (*(library.distribution for library in libraries), "redis"):
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return ", ".join(found)


INTRO = {
    "hot": "The key holds a stale value when the run begins (stored fresh for "
    f"{STALE_AFTER:g} s, kept {STALE_TTL} s more; dogpile.cache's workers soft-invalidate their "
    "region, its way to the same).",
    "cold": "Nothing is stored under the key when the run begins.",
}


def section(case: Case, plan: Plan, outcomes: Sequence[Outcome], notes: Sequence[str]) -> Section:
    intro = (
        f"{PROCESSES} processes x {THREADS} threads call get-or-rebuild on one key, one call after "
        f"another, for {plan.seconds:g} s; the rebuild is a query that takes "
        f"{QUERY_SECONDS * 1000:.0f} ms and raises `DatabaseDown` if begun in the first "
        f"{plan.seconds_down:g} s. {INTRO[case]} A call counts as down if it began while the "
        "database was down. Attempts: the queries begun while it was down, per second (and in "
        "all), and the most begun within any one second; served: calls that returned a value, "
        "stale or fresh; raised once back: calls begun after it was back that still raised. "
        "p50, p99, max: every call of the run. First value after back: from the moment the "
        "database answers again to the return of the first call holding a value built since "
        "(the caller that stored it). Values fresh for "
        f"{TTL} s, kept {STALE_TTL} s once stale; each library on a fresh redis-server. "
        f"{_versions([outcome.library for outcome in outcomes])}."
    )
    table = Table(HEADERS, [row(outcome) for outcome in outcomes], "l" + "r" * 5 + "l" + "r" * 5)
    return Section(f"A database that keeps failing: the {case} key", intro, table, notes)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench storm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seconds", type=float, default=Plan.seconds, help="the run's length (default 10)")
    parser.add_argument(
        "--seconds-down",
        type=float,
        default=Plan.seconds_down,
        help="how long the database is down, from the start (default 6)",
    )
    parser.add_argument("--quick", action="store_true", help="halve both")
    parser.add_argument("--case", action="append", choices=CASES, help="hot or cold (repeatable)")
    parser.add_argument(
        "--library", action="append", choices=list(BY_NAME), help="stampede or dogpile (repeatable)"
    )
    args = parser.parse_args(argv)
    plan = Plan(args.seconds, args.seconds_down)
    if not 0 < plan.seconds_down < plan.seconds:
        parser.error("--seconds-down must be above 0 and below --seconds")
    if args.quick:
        plan = plan.halved()
    notes: list[str] = []
    libraries: list[Library] = []
    for library in (BY_NAME[name] for name in args.library or BY_NAME):
        if missing := library.missing():
            notes.append(
                f"{library.label}: {', '.join(missing)} not installed "
                "(`pip install -e \".[bench]\"`); its rows are left out."
            )
        else:
            libraries.append(library)
    started = time.monotonic()
    sections = []
    for case in args.case or CASES:
        outcomes = []
        for library in libraries:
            progress(f"storm {case}, {library.name}: running ({plan.seconds:g} s)")
            outcome = run(library, case, plan)
            progress(f"storm {case}, {library.name}: {describe(outcome)}")
            outcomes.append(outcome)
        sections.append(section(case, plan, outcomes, notes))
    print(environment_line(servers.default_version(), quick=args.quick), end="\n\n")
    print("\n\n".join(render_section(s) for s in sections))
    progress(f"{len(sections)} section(s) in {time.monotonic() - started:.0f} s")
    return 0
