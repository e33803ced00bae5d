"""Scenario 5: coherence. One process writes a key, another reads it; no read may return a value
older than a write that had returned before the read began.

For each peer that keeps copies in process memory (and for naive cache-aside and stampede
without one, as baselines), on its own server: a writer process sets the key to 0, then to
1, 2, ... :data:`WRITES` through the peer's own write API, one write every :data:`INTERVAL`
seconds, and after each write returns publishes its number and a ``time.monotonic_ns()``
stamp in shared memory; a reader process reads the key through the peer in a loop. Before
each read the reader notes the floor, the highest number whose write had returned; a read
that returns less is stale, and late if it began more than :data:`BOUND` seconds after the
floor's write returned. Both processes are spawned afresh for each peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import queue
import signal
import time
import traceback
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from typing import Any

import redis

from .._common.phase import Phase
from .._common.report import Section, Table, millis
from .._common.workload import delete_matching, key_prefix
from ..peers import STALE_TTL, AsyncPeer, PeerSpec, SyncPeer, open_async, open_sync, spec

__all__ = ["BOUND", "INTERVAL", "WRITES", "Reading", "run"]

#: How many numbers the writer writes after the first (0), and the pause after each write.
WRITES = 600
INTERVAL = 0.003
#: A stale read that began later than this after the floor's write returned is late: the
#: issue's judged bound, which stampede's near cache must meet with no late read at all.
BOUND = 0.002
#: The key's TTL: long, so that nothing expires during the run.
TTL = 60
#: Seconds of reads before the writes begin: they fill the near caches and let their
#: invalidation listeners start.
WARM_SECONDS = 0.5
#: Seconds a process waits for the other (spawning imports every peer), and the parent for both.
READY_TIMEOUT = 60.0
TIMEOUT = 120.0


@dataclass
class Reading:
    """What the reader saw. ``max_lag_ns``: of the stale reads, the longest time between the floor's
    write returning and the read beginning; ``behind``: the most numbers a read was behind its floor."""

    reads: int = 0
    warm_reads: int = 0
    stale: int = 0
    late: int = 0
    max_lag_ns: int = 0
    behind: int = 0
    errors: int = 0
    messages: list[str] = field(default_factory=list)

    def fail(self, exc: BaseException) -> None:
        self.errors += 1
        message = f"{type(exc).__name__}: {exc}"
        if len(self.messages) < 3 and message not in self.messages:
            self.messages.append(message)

    def note(self, floor: int, outcome: object, lag_ns: int) -> None:
        """One read that began ``lag_ns`` after the write of ``floor`` returned."""
        if isinstance(outcome, BaseException):
            self.fail(outcome)
            return
        if not isinstance(outcome, int):
            self.fail(TypeError(f"read back {outcome!r}, not a number"))
            return
        self.reads += 1
        if outcome < floor:
            self.stale += 1
            self.late += lag_ns > BOUND * 1e9
            self.max_lag_ns = max(self.max_lag_ns, lag_ns)
            self.behind = max(self.behind, floor - outcome)


@dataclass(frozen=True)
class _Report:
    """A process's message to the parent: the reader's :class:`Reading`, the writer's seconds for its
    writes, or what went wrong."""

    role: str
    reading: Reading | None = None
    seconds: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class _Result:
    peer: PeerSpec
    reading: Reading | None
    seconds: float
    commands: int
    error: str | None


# --- in the writer and reader processes ---------------------------------------


def _publish(written: Any, stamps: Any, number: int) -> None:
    stamps[number] = time.monotonic_ns()
    written.value = number  # after its stamp: a reader that sees the number finds the stamp


def _wait_for_reader(ready: Any) -> None:
    if not ready.wait(READY_TIMEOUT):
        raise RuntimeError(f"the reader did not start reading within {READY_TIMEOUT:g} s")


def _reads(reading: Reading, written: Any, stamps: Any, ready: Any) -> Generator[None, object, None]:
    """The reader's loop, for either driver: each ``yield`` is one read through the peer, sent back
    what it returned (or raised). The floor and the start time are taken just before it."""
    warm_until = time.monotonic() + WARM_SECONDS
    while time.monotonic() < warm_until:
        outcome = yield
        reading.warm_reads += 1
        if isinstance(outcome, BaseException):
            reading.fail(outcome)
    ready.set()
    while True:
        floor = written.value
        began = time.monotonic_ns()
        outcome = yield
        reading.note(floor, outcome, began - stamps[floor])
        if floor >= WRITES:
            return


def _no_rebuild() -> Any:
    raise AssertionError("the coherence reader rebuilt the key: it should always be there")


async def _ano_rebuild() -> Any:
    return _no_rebuild()


@contextlib.contextmanager
def _sync_peer(name: str, url: str, prefix: str, phase: Phase) -> Iterator[SyncPeer]:
    client = redis.Redis.from_url(url, socket_timeout=30.0, socket_connect_timeout=10.0)
    peer = open_sync(name, url, prefix=prefix, phases=[phase], client=client, pool_size=2)
    try:
        yield peer
    finally:
        peer.close()
        client.close()


@contextlib.asynccontextmanager
async def _async_peer(name: str, url: str) -> AsyncIterator[AsyncPeer]:
    peer = await open_async(name, url, pool_size=2)
    try:
        yield peer
    finally:
        await peer.aclose()


def _write(name: str, url: str, prefix: str, phase: Phase, written: Any, stamps: Any, ready: Any) -> float:
    with _sync_peer(name, url, prefix, phase) as peer:
        peer.write(phase, 0)
        _publish(written, stamps, 0)
        _wait_for_reader(ready)
        started = time.monotonic()
        for number in range(1, WRITES + 1):
            peer.write(phase, number)
            _publish(written, stamps, number)
            time.sleep(INTERVAL)
        return time.monotonic() - started


async def _awrite(name: str, url: str, phase: Phase, written: Any, stamps: Any, ready: Any) -> float:
    async with _async_peer(name, url) as peer:
        await peer.write(phase, 0)
        _publish(written, stamps, 0)
        await asyncio.to_thread(_wait_for_reader, ready)
        started = time.monotonic()
        for number in range(1, WRITES + 1):
            await peer.write(phase, number)
            _publish(written, stamps, number)
            await asyncio.sleep(INTERVAL)
        return time.monotonic() - started


def _read(name: str, url: str, prefix: str, phase: Phase, written: Any, stamps: Any, ready: Any) -> Reading:
    reading = Reading()
    with _sync_peer(name, url, prefix, phase) as peer, peer.session(phase, _no_rebuild) as request:
        steps = _reads(reading, written, stamps, ready)
        with contextlib.suppress(StopIteration):
            next(steps)
            while True:
                outcome: object
                try:
                    outcome = request()
                except Exception as exc:
                    outcome = exc
                steps.send(outcome)
    return reading


async def _aread(name: str, url: str, phase: Phase, written: Any, stamps: Any, ready: Any) -> Reading:
    reading = Reading()
    async with _async_peer(name, url) as peer, peer.session(phase, _ano_rebuild) as request:
        steps = _reads(reading, written, stamps, ready)
        with contextlib.suppress(StopIteration):
            next(steps)
            while True:
                outcome: object
                try:
                    outcome = await request()
                except Exception as exc:
                    outcome = exc
                # One turn of the event loop per read, as between two requests an asyncio server
                # serves: a peer's background tasks (its invalidation listener) get to run.
                await asyncio.sleep(0)
                steps.send(outcome)
    return reading


def _writer_main(
    name: str,
    url: str,
    prefix: str,
    phase: Phase,
    written: Any,
    stamps: Any,
    ready: Any,
    reports: Queue[_Report],
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns Ctrl-C, and stops us
    try:
        if spec(name).is_async:
            seconds = asyncio.run(_awrite(name, url, phase, written, stamps, ready))
        else:
            seconds = _write(name, url, prefix, phase, written, stamps, ready)
        reports.put(_Report("writer", seconds=seconds))
    except Exception:
        reports.put(_Report("writer", error=traceback.format_exc()))


def _reader_main(
    name: str,
    url: str,
    prefix: str,
    phase: Phase,
    written: Any,
    stamps: Any,
    ready: Any,
    reports: Queue[_Report],
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while written.value < 0:  # the writer's first write: the key exists from then on
            if time.monotonic() > deadline:
                raise RuntimeError(f"the writer did not write within {READY_TIMEOUT:g} s")
            time.sleep(0.001)
        if spec(name).is_async:
            reading = asyncio.run(_aread(name, url, phase, written, stamps, ready))
        else:
            reading = _read(name, url, prefix, phase, written, stamps, ready)
        reports.put(_Report("reader", reading=reading))
    except Exception:
        reports.put(_Report("reader", error=traceback.format_exc()))


# --- in the parent -----------------------------------------------------------


def run(
    urls: dict[str, str], peers: Sequence[PeerSpec], run_id: str, *, log: Callable[[str], None]
) -> Section:
    """Measure each of ``peers`` on its server (``urls``), one after another; the section."""
    results = []
    for peer in peers:
        log(f"coherence {peer.name}: running")
        results.append(_measure(peer, urls[peer.name], run_id))
    return _section(results)


def _measure(peer: PeerSpec, url: str, run_id: str) -> _Result:
    ctx = multiprocessing.get_context("spawn")
    phase = Phase(
        "coherence",
        peer.name,
        f"{key_prefix(run_id)}coherence:{peer.name}",
        ttl=TTL,
        stale_ttl=STALE_TTL if peer.stale else 0,
    )
    written = ctx.Value("q", -1, lock=False)
    stamps = ctx.Array("q", WRITES + 1, lock=False)
    ready = ctx.Event()
    reports: Queue[_Report] = ctx.Queue()
    args = (peer.name, url, key_prefix(run_id), phase, written, stamps, ready, reports)
    processes = [
        ctx.Process(target=_writer_main, args=args, name="bench-coherence-writer"),
        ctx.Process(target=_reader_main, args=args, name="bench-coherence-reader"),
    ]
    client = redis.Redis.from_url(url, socket_timeout=10.0)
    try:
        before = _commands(client)
        for process in processes:
            process.start()
        got = _collect(reports, processes)
        commands = _commands(client) - before
        delete_matching(client, f"*{phase.key}*")
    finally:
        _stop(processes)
        reports.close()
        client.close()
    errors = [f"{report.role}: {report.error}" for report in got.values() if report.error]
    return _Result(
        peer,
        reading=got["reader"].reading if "reader" in got else None,
        seconds=got["writer"].seconds if "writer" in got else float("nan"),
        commands=commands,
        error="\n".join(errors) or None,
    )


def _commands(client: redis.Redis) -> int:
    return int(client.info("stats")["total_commands_processed"])


def _collect(reports: Queue[_Report], processes: Sequence[BaseProcess]) -> dict[str, _Report]:
    """The two reports, by role; less if one failed (then the other is not waited for)."""
    got: dict[str, _Report] = {}
    deadline = time.monotonic() + TIMEOUT
    while len(got) < len(processes):
        try:
            report = reports.get(timeout=1.0)
        except queue.Empty:
            dead = [p.name for p in processes if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                why = f"{', '.join(dead)} died" if dead else f"no report within {TIMEOUT:g} s"
                got.setdefault("parent", _Report("parent", error=why))
                return got
            continue
        got[report.role] = report
        if report.error is not None:
            return got
    return got


def _stop(processes: Sequence[BaseProcess]) -> None:
    for process in processes:
        if process.pid is not None:
            process.join(5.0)
        if process.is_alive():
            process.terminate()
            process.join(10.0)


def _section(results: Sequence[_Result]) -> Section:
    rows = [_row(result) for result in results]
    notes: list[str] = []
    for result in results:
        if result.error:
            last = result.error.strip().splitlines()[-1]
            notes.append(f"{result.peer.label} failed: {last}")
        if result.reading is not None and result.reading.messages:
            notes.append(f"{result.peer.label} errors: {'; '.join(result.reading.messages)}")
    timed = [f"{r.peer.name} {r.seconds:.2f} s" for r in results if r.seconds == r.seconds]
    if timed:
        notes.append(f"The {WRITES} writes took (writer's time): {', '.join(timed)}.")
    judged = [r for r in results if r.peer.name.startswith("stampede") and "near" in r.peer.name]
    if judged:
        late = {r.peer.label: r.reading.late if r.reading else None for r in judged}
        met = all(count == 0 for count in late.values())
        shown = "; ".join(f"{label}: {'no run' if n is None else n}" for label, n in late.items())
        notes.append(
            f"Target for stampede's near cache: no stale read that began more than {millis(BOUND)} "
            f"after the write's reply: {'met' if met else 'NOT met'} ({shown})."
        )
    return Section(
        title="5. Coherence: one writer, one reader",
        intro=(
            f"A writer process sets the key to 0 and then 1, 2, ... {WRITES} through the peer's own "
            f"write API, pausing {millis(INTERVAL)} after each, and publishes each number with the time "
            "its write returned (shared memory); a reader process reads the key through the peer in a "
            f"loop, after {WARM_SECONDS:g} s of warm-up reads (asyncio peers: one turn of the event loop "
            "between reads). The floor of a read is the highest number whose write had returned when "
            "the read began; a read below it is stale. Lag: how long after the floor's write returned "
            f"the stale read began; late: a stale read with a lag over {millis(BOUND)}. Commands per "
            "read: every command its server processed in the run, the writer's included, over the reads "
            "(warm-up reads included). Each peer on its own server, each with two fresh processes."
        ),
        table=Table(
            headers=[
                "peer",
                "driver",
                "reads",
                "stale reads",
                "most writes behind",
                "largest lag",
                f"stale > {millis(BOUND)} after the write",
                "Redis commands per read",
                "errors",
            ],
            rows=rows,
            align="llrrrrrrr",
        ),
        notes=notes,
    )


def _row(result: _Result) -> list[str]:
    driver = "asyncio" if result.peer.is_async else "sync"
    reading = result.reading
    if reading is None:
        return [result.peer.label, driver, *["n/a"] * 6, "failed"]
    total = reading.reads + reading.warm_reads + reading.errors
    return [
        result.peer.label,
        driver,
        str(reading.reads),
        str(reading.stale),
        str(reading.behind),
        millis(reading.max_lag_ns / 1e9) if reading.stale else "-",
        str(reading.late),
        f"{result.commands / total:.3f}" if total else "n/a",
        str(reading.errors),
    ]
