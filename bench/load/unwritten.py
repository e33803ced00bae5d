"""Scenario: a key nobody ever writes. Many sites read a flag from the cache on every request (or
every task: ``cache.get("maintenance_mode")``) that is only set on the rare day it is needed, so
the read misses, always; and a page cached for less time than it takes to render is missed again
before its render ends. Each part runs Django's own ``RedisCache`` and stampede's
``StampedeCache`` side by side, on their default options, each on a fresh redis-server and a fresh
server process (or fresh worker processes):

1. A sync view reads the never-written key, then works 50 ms; gunicorn gthread (2 workers x 16
   threads), 32 clients for 30 s.
2. The same as an async view (``await cache.aget``, ``await asyncio.sleep``) under uvicorn,
   2 workers.
3. Four plain processes (Django set up with the same ``CACHES``, no HTTP) each read another
   never-written key and sleep 10 ms, again and again for 30 s.
4. A sync view under Django's ``cache_page(5)`` that renders in 8 s; gunicorn gthread (2 x 16),
   20 clients for 20 s.

Per part: requests (or loops) per second, the median, slowest 1% and slowest answer (or read),
answers other than 200; for the slow page, its renders in all and per 5-s window; and how many
lines of the server's output say a caller "waited" (stampede logs ``waited 10s for the rebuild of
...`` when a caller gave up waiting for a value). ``python -m bench unwritten [--quick] [--part
N]``, or within ``python -m bench herd``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stampede.testing import RedisServer
from support.app_servers import SERVERS, AppServerError, Server

from .._common import servers
from .._common.report import Section, Table, environment_line, progress, render_section
from .._common.stats import percentile
from . import _sustained
from ._apps import SOURCE_ROOT, app_server
from ._apps.sustained_config import Backend
from ._apps.unwritten_config import AppConfig
from ._timeline import Render, Timeline

__all__ = ["PARTS", "run"]

PARTS = (1, 2, 3, 4)
BACKENDS: tuple[Backend, ...] = ("stock", "stampede")
LABELS: dict[Backend, str] = {"stock": "RedisCache", "stampede": "StampedeCache"}

#: ``CACHES["default"]["TIMEOUT"]``, in every part.
TIMEOUT = 300
#: Parts 1 and 2: clients, seconds, and each view's work after the read.
CLIENTS = 32
SECONDS = 30.0
WORK_SECONDS = 0.05
#: Part 3: worker processes, and each one's pause after a read.
PROCESSES = 4
PAUSE = 0.01
#: Part 3: a read slower than this many seconds is counted apart.
SLOW_GET = 1.0
#: Part 4: clients and seconds; the page's ``cache_page`` timeout and its render.
SLOW_CLIENTS = 20
SLOW_SECONDS = 20.0
PAGE_TIMEOUT = 5
RENDER_SECONDS = 8.0
#: ``--quick``: parts 1 to 3, then part 4.
QUICK_SECONDS = 3.0
QUICK_SLOW_SECONDS = 12.0
#: Seconds a client waits for an answer (or a worker for its end) before giving up.
PATIENCE = 120.0

GTHREAD = SERVERS["gunicorn-gthread"].with_threads(16)
UVICORN = SERVERS["uvicorn-2"]

Log = Callable[[str], None]


class WorkerError(RuntimeError):
    """A worker process did not start, or did not report."""


@dataclass(frozen=True)
class Served:
    """What the clients of one HTTP part got from one cache."""

    load: _sustained.Load
    elapsed: float
    waited: int
    server_errors: collections.Counter[str]
    #: The slow page's renders: begun in all, those that ended, and when the load began (wall clock).
    begun: int = 0
    renders: list[Render] = field(default_factory=list)
    started: float = 0.0

    @property
    def rate(self) -> float:
        return self.load.requests / self.elapsed if self.elapsed > 0 else math.nan


@dataclass(frozen=True)
class Looped:
    """What the worker processes of part 3 did on one cache."""

    loops: int
    gets: list[float]
    errors: collections.Counter[str]
    elapsed: float
    waited: int

    @property
    def rate(self) -> float:
        return self.loops / self.elapsed if self.elapsed > 0 else math.nan


Outcome = Served | Looped | str


def _waited(text: str) -> int:
    return sum(1 for line in text.splitlines() if "waited" in line)


@contextlib.contextmanager
def _run_dir(backend: Backend) -> Iterator[AppConfig]:
    """A fresh redis-server and a working directory, and the app's configuration on them."""
    with RedisServer() as redis, tempfile.TemporaryDirectory(prefix="stampede-unwritten-") as workdir:
        yield AppConfig(
            backend=backend,
            redis_url=redis.url,
            timeout=TIMEOUT,
            page_timeout=PAGE_TIMEOUT,
            render_seconds=RENDER_SECONDS,
            work_seconds=WORK_SECONDS,
            timeline=workdir,
        )


def http_run(server: Server, path: str, backend: Backend, *, clients: int, seconds: float) -> Served:
    """Serve the app under ``server`` on ``backend`` and drive ``clients`` clients at ``path``."""
    with _run_dir(backend) as config:
        target = "wsgi" if server.interface == "wsgi" else "application"
        with app_server(
            f"unwritten_django:{target}",
            server,
            env=config.to_env(),
            name=f"unwritten django ({server.described})",
            workdir=config.timeline,
        ) as running:
            started = time.time()
            clock = time.monotonic()
            load = _sustained.drive(running.port, path, clients=clients, seconds=seconds, timeout=PATIENCE)
            elapsed = time.monotonic() - clock
            time.sleep(0.5)  # the last lines of the server's output are written
            running.check()
            timeline = Timeline(config.timeline, "slow")
            return Served(
                load=load,
                elapsed=elapsed,
                waited=_waited(running.output()),
                server_errors=running.errors(),
                begun=timeline.begun(),
                renders=timeline.renders(),
                started=started,
            )


def processes_run(backend: Backend, *, processes: int, seconds: float) -> Looped:
    """``processes`` worker processes on ``backend``, reading a never-written key for ``seconds``."""
    with _run_dir(backend) as config:
        environment = {**os.environ, **config.to_env(), "PYTHONUNBUFFERED": "1"}
        command = [sys.executable, "-m", "bench.load._apps.unwritten_worker", str(seconds), str(PAUSE)]
        logs = [Path(config.timeline, f"worker-{index}.log") for index in range(processes)]
        workers: list[subprocess.Popen[str]] = []
        try:
            for log in logs:
                with log.open("wb") as stderr:
                    workers.append(
                        subprocess.Popen(
                            command,
                            env=environment,
                            cwd=SOURCE_ROOT,
                            stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE,
                            stderr=stderr,
                            text=True,
                        )
                    )
            for worker, log in zip(workers, logs, strict=True):
                assert worker.stdout is not None
                if worker.stdout.readline().strip() != "ready":
                    raise WorkerError(f"a worker did not start:\n{_tail(log)}")
            for worker in workers:  # all at once
                assert worker.stdin is not None
                worker.stdin.write("go\n")
                worker.stdin.flush()
            reports = []
            for worker, log in zip(workers, logs, strict=True):
                try:
                    out, _ = worker.communicate(timeout=seconds + PATIENCE)
                except subprocess.TimeoutExpired:
                    raise WorkerError(f"a worker did not finish in time:\n{_tail(log)}") from None
                if worker.returncode != 0 or not out.strip():
                    raise WorkerError(f"a worker exited with code {worker.returncode}:\n{_tail(log)}")
                reports.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
        errors: collections.Counter[str] = collections.Counter()
        for report in reports:
            errors.update(report["errors"])
        return Looped(
            loops=sum(report["loops"] for report in reports),
            gets=[got for report in reports for got in report["gets"]],
            errors=errors,
            elapsed=max(report["elapsed"] for report in reports),
            waited=sum(_waited(log.read_text(errors="replace")) for log in logs),
        )


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) or "(no output)"
    except OSError:
        return "(no output)"


# --- the parts ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    number: int
    title: str
    server: Server | None
    #: Runs one cache.
    measure: Callable[[Backend, bool], Served | Looped]


def _part1(backend: Backend, quick: bool) -> Served:
    return http_run(GTHREAD, "/flag", backend, clients=CLIENTS, seconds=QUICK_SECONDS if quick else SECONDS)


def _part2(backend: Backend, quick: bool) -> Served:
    return http_run(UVICORN, "/aflag", backend, clients=CLIENTS, seconds=QUICK_SECONDS if quick else SECONDS)


def _part3(backend: Backend, quick: bool) -> Looped:
    return processes_run(backend, processes=PROCESSES, seconds=QUICK_SECONDS if quick else SECONDS)


def _part4(backend: Backend, quick: bool) -> Served:
    seconds = QUICK_SLOW_SECONDS if quick else SLOW_SECONDS
    return http_run(GTHREAD, "/slow", backend, clients=SLOW_CLIENTS, seconds=seconds)


_PARTS = {
    1: Part(1, "A never-written key under gunicorn gthread", GTHREAD, _part1),
    2: Part(2, "A never-written key in an async view under uvicorn", UVICORN, _part2),
    3: Part(3, "A never-written key in worker processes, outside requests", None, _part3),
    4: Part(4, "A cached page that renders slower than it stays cached", GTHREAD, _part4),
}


def run(*, parts: Sequence[int] = PARTS, quick: bool = False, log: Log) -> list[Section]:
    """Run the ``parts``, RedisCache then StampedeCache in each; a section per part."""
    sections = []
    for number in parts:
        part = _PARTS[number]
        if part.server is not None and (missing := part.server.missing()):
            log(f"unwritten part {number}: skipped, {', '.join(missing)} not installed")
            continue
        outcomes: dict[Backend, Outcome] = {}
        for backend in BACKENDS:
            log(f"unwritten part {number} ({LABELS[backend]}): running")
            try:
                outcome: Outcome = part.measure(backend, quick)
            except (AppServerError, WorkerError) as exc:
                log(f"unwritten part {number} ({LABELS[backend]}): {exc}")
                outcome = f"failed: {str(exc).splitlines()[0]}"
            outcomes[backend] = outcome
            log(f"unwritten part {number} ({LABELS[backend]}): {_describe(outcome)}")
        sections.append(_section(number, outcomes, quick=quick))
    return sections


def _describe(outcome: Outcome) -> str:
    if isinstance(outcome, str):
        return outcome
    if isinstance(outcome, Looped):
        return f"{outcome.loops} loops, slowest get {_duration(max(outcome.gets, default=math.nan))}"
    return (
        f"{outcome.load.requests} requests, statuses {dict(outcome.load.statuses)}, "
        f"{outcome.begun} renders, {outcome.waited} 'waited' lines"
    )


# --- the tables -----------------------------------------------------------------------------


def _section(number: int, outcomes: dict[Backend, Outcome], *, quick: bool) -> Section:
    seconds = QUICK_SECONDS if quick else SECONDS
    slow_seconds = QUICK_SLOW_SECONDS if quick else SLOW_SECONDS
    command = f"`python -m bench unwritten --part {number}{' --quick' if quick else ''}`"
    fresh = "each cache on a fresh redis-server"
    notes: list[str] = []
    if number == 3:
        headers = [
            "cache",
            "loops",
            "loops/s",
            "p50 get",
            "p99 get",
            "max get",
            f"gets over {SLOW_GET:g} s",
            "errors",
            '"waited" lines',
        ]
        rows = [_looped_row(backend, outcomes[backend]) for backend in BACKENDS]
        align = "lrrrrrrrr"
        intro = (
            f"{PROCESSES} plain Python processes (`django.setup()` with the same `CACHES`, no HTTP) each "
            f'loop for {seconds:g} s: `cache.get("feature:beta-banner")`, a key never written, then '
            f"`time.sleep({PAUSE:g})`. Loops: all processes together, per second of the longest "
            f"process's loop (a read under way at the end finishes it); the reads' times over all of "
            f"them; {fresh}; {command}."
        )
    else:
        headers = ["cache", "requests/s", "p50", "p99", "max", "non-200", "requests"]
        if number == 4:
            headers += ["renders", f"renders per {PAGE_TIMEOUT}-s window"]
        headers.append('"waited" lines')
        rows = [_served_row(backend, outcomes[backend], number, slow_seconds) for backend in BACKENDS]
        align = "l" + "r" * (len(headers) - 1)
        if number == 1:
            intro = (
                f'A sync view does `cache.get("maintenance_mode")` (never written: None) then '
                f"`time.sleep({WORK_SECONDS:g})`; {GTHREAD.described}; {CLIENTS} clients (threads, "
                f"keep-alive) for {seconds:g} s"
            )
        elif number == 2:
            intro = (
                f'An async view does `await cache.aget("maintenance_mode")` (never written) then '
                f"`await asyncio.sleep({WORK_SECONDS:g})`; {UVICORN.described}; {CLIENTS} clients for "
                f"{seconds:g} s"
            )
        else:
            intro = (
                f"A sync view under Django's `cache_page({PAGE_TIMEOUT})` renders in {RENDER_SECONDS:g} s "
                f"(`CACHES` `TIMEOUT` {TIMEOUT}, other options the defaults); {GTHREAD.described}; "
                f"{SLOW_CLIENTS} clients for {slow_seconds:g} s. Renders: begun in all, and by the "
                f"{PAGE_TIMEOUT}-s window of the run they began in (after the slash-separated windows, "
                "those begun after the run's end, by requests in flight)"
            )
        intro += (
            f". Requests/s: answers over the run's wall time (the last answers' too); {fresh} and a "
            f'fresh server; "waited" lines: lines of the server\'s output that say so; {command}.'
        )
        for backend in BACKENDS:
            outcome = outcomes[backend]
            if isinstance(outcome, Served) and outcome.server_errors:
                shown = ", ".join(f"{count} x {name}" for name, count in outcome.server_errors.most_common(3))
                notes.append(f"{LABELS[backend]}: the server logged {shown}.")
    if number != 4:
        notes = [*_ratios(outcomes), *notes]
    title = f"Never-written keys, part {number}: {_PARTS[number].title[0].lower()}{_PARTS[number].title[1:]}"
    return Section(title=title, intro=intro, table=Table(headers, rows, align), notes=notes)


def _served_row(backend: Backend, outcome: Outcome, number: int, seconds: float) -> list[str]:
    columns = 8 if number != 4 else 10
    if isinstance(outcome, str) or isinstance(outcome, Looped):
        return [LABELS[backend], str(outcome), *([""] * (columns - 2))]
    latencies = outcome.load.latencies
    row = [
        LABELS[backend],
        f"{outcome.rate:.1f}",
        _duration(percentile(latencies, 50)),
        _duration(percentile(latencies, 99)),
        _duration(max(latencies, default=math.nan)),
        str(outcome.load.failed),
        str(outcome.load.requests),
    ]
    if number == 4:
        row += [str(outcome.begun), _windows(outcome, seconds)]
    row.append(str(outcome.waited))
    return row


def _looped_row(backend: Backend, outcome: Outcome) -> list[str]:
    if not isinstance(outcome, Looped):
        return [LABELS[backend], str(outcome), *([""] * 7)]
    return [
        LABELS[backend],
        str(outcome.loops),
        f"{outcome.rate:.1f}",
        _duration(percentile(outcome.gets, 50)),
        _duration(percentile(outcome.gets, 99)),
        f"{max(outcome.gets, default=math.nan):.3f} s",
        str(sum(1 for got in outcome.gets if got > SLOW_GET)),
        str(sum(outcome.errors.values())),
        str(outcome.waited),
    ]


def _windows(outcome: Served, seconds: float) -> str:
    """The renders by the window of the run they began in: ``3 / 0 / 2 / 0``, then ``(+1 after)``."""
    windows = [0] * math.ceil(seconds / PAGE_TIMEOUT)
    after = 0
    for render in outcome.renders:
        offset = render.start - outcome.started
        if offset >= seconds:
            after += 1
        else:
            windows[max(0, int(offset // PAGE_TIMEOUT))] += 1
    shown = " / ".join(map(str, windows))
    return f"{shown} (+{after} after)" if after else shown


def _ratios(outcomes: dict[Backend, Outcome]) -> list[str]:
    stock, ours = outcomes["stock"], outcomes["stampede"]
    if isinstance(stock, str) or isinstance(ours, str):
        return []
    if isinstance(stock, Looped) and isinstance(ours, Looped):
        rates, tails = (ours.rate, stock.rate), (percentile(ours.gets, 99), percentile(stock.gets, 99))
        unit = "loops/s"
    elif isinstance(stock, Served) and isinstance(ours, Served):
        rates = (ours.rate, stock.rate)
        tails = (percentile(ours.load.latencies, 99), percentile(stock.load.latencies, 99))
        unit = "requests/s"
    else:
        return []
    return [
        f"StampedeCache / RedisCache throughput: {_ratio(*rates)} "
        f"({rates[0]:.1f} against {rates[1]:.1f} {unit}).",
        f"p99 ratio (StampedeCache / RedisCache): {_ratio(*tails)} "
        f"({_duration(tails[0])} against {_duration(tails[1])}).",
    ]


def _ratio(ours: float, theirs: float) -> str:
    if math.isnan(ours) or math.isnan(theirs) or theirs == 0:
        return "n/a"
    ratio = ours / theirs
    return f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:.2g}x"


def _duration(seconds: float) -> str:
    if math.isnan(seconds):
        return "n/a"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench unwritten",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"parts 1 to 3 for {QUICK_SECONDS:g} s, part 4 for {QUICK_SLOW_SECONDS:g} s",
    )
    parser.add_argument(
        "--part", type=int, action="append", choices=PARTS, help="run only this part (repeatable)"
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    sections = run(parts=args.part or PARTS, quick=args.quick, log=progress)
    print(environment_line(servers.default_version(), quick=args.quick), end="\n\n")
    print("\n\n".join(render_section(section) for section in sections))
    progress(f"{len(sections)} part(s) in {time.monotonic() - started:.0f} s")
