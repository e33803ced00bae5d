"""What the benchmark's child processes run.

Everything a child needs is defined at module level, so that the "spawn"
start method can import it in a fresh interpreter. Each worker process makes
its own Redis client and its own :class:`stampede.Stampede` (one per process,
shared by its threads, as an application would), then starts its caller
threads. All callers of all processes run the same list of :class:`Phase`
in step: two rounds of a shared barrier per phase (everyone is ready; the
parent has prepared the key and set the start time), then each caller sleeps
until the agreed start time and sends its requests.
"""

from __future__ import annotations

import functools
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from types import FrameType
from typing import Any, Literal, cast

import redis

import stampede

from ._workload import NAMESPACE, REBUILD_SECONDS, make_value

__all__ = ["Mode", "Phase", "PhaseRecord", "WorkerReport", "barrier_timeout", "worker_main"]

#: ``naive``: GET, and on a miss rebuild then SET with EX (cache-aside).
#: ``stampede``: ``get_or_rebuild``, refreshing inline. ``stampede-bg``: with ``background=True``.
Mode = Literal["naive", "stampede", "stampede-bg"]


@dataclass(frozen=True)
class Phase:
    """One measured run: every caller requests ``key`` with the same approach.

    ``duration`` 0 means one request per caller (a cold key); otherwise each
    caller loops for ``duration`` seconds, pausing ``think`` seconds between
    requests. Each rebuild INCRs ``counter_key`` (so rebuilds are counted in
    Redis, across processes), then sleeps ``rebuild_seconds``.
    """

    mode: Mode
    key: str
    ttl: int
    stale_ttl: int = 0
    duration: float = 0.0
    think: float = 0.0
    rebuild_seconds: float = REBUILD_SECONDS

    @property
    def counter_key(self) -> str:
        return f"{self.key}:rebuilds"


@dataclass
class PhaseRecord:
    """What happened in one phase. Times are in seconds; offsets are wall-clock
    seconds after the phase's agreed start time, comparable across processes.

    Attributes:
        latencies: of each request that returned a value.
        ends: offset at which each of those requests returned.
        start_delays: per caller, how late it sent its first request.
        rebuilds: (start, end) offsets of each rebuild that ran.
        errors: one line per request that raised.
    """

    latencies: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    start_delays: list[float] = field(default_factory=list)
    rebuilds: list[tuple[float, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def absorb(self, other: PhaseRecord) -> None:
        self.latencies.extend(other.latencies)
        self.ends.extend(other.ends)
        self.start_delays.extend(other.start_delays)
        self.rebuilds.extend(other.rebuilds)
        self.errors.extend(other.errors)


@dataclass(frozen=True)
class WorkerReport:
    """A worker's message to the parent: one record per phase, or what went wrong."""

    index: int
    records: list[PhaseRecord] | None = None
    error: str | None = None


def barrier_timeout(phases: Sequence[Phase]) -> float:
    """How long anyone waits at the barrier before giving up: the longest phase, plus slack
    for spawning the processes and for slow machines."""
    return 60.0 + max((p.duration for p in phases), default=0.0)


# --- one request -------------------------------------------------------------


def _rebuild(client: redis.Redis, phase: Phase, rebuilds: list[tuple[float, float]], start_at: float) -> Any:
    """The expensive rebuild: counted in Redis (across processes), then slow.

    Appends its (start, end) offsets to ``rebuilds``; it may run in a caller
    thread or in one of stampede's background threads (``list.append`` is atomic).
    """
    started = time.time()
    client.incr(phase.counter_key)
    time.sleep(phase.rebuild_seconds)
    rebuilds.append((started - start_at, time.time() - start_at))
    return make_value()


def _naive_get(client: redis.Redis, phase: Phase, rebuild: Callable[[], Any]) -> Any:
    """Cache-aside as most code writes it: no lock, every miss rebuilds."""
    raw = cast("bytes | None", client.get(phase.key))
    if raw is not None:
        return pickle.loads(raw)
    value = rebuild()
    client.set(phase.key, pickle.dumps(value, pickle.HIGHEST_PROTOCOL), ex=phase.ttl)
    return value


def _requester(
    phase: Phase, client: redis.Redis, sf: stampede.Stampede, record: PhaseRecord, start_at: float
) -> Callable[[], Any]:
    rebuild = functools.partial(_rebuild, client, phase, record.rebuilds, start_at)
    if phase.mode == "naive":
        return functools.partial(_naive_get, client, phase, rebuild)
    return functools.partial(
        sf.get_or_rebuild,
        phase.key,
        rebuild,
        ttl=phase.ttl,
        stale_ttl=phase.stale_ttl,
        background=phase.mode == "stampede-bg",
    )


# --- one caller thread -------------------------------------------------------


def _run_phase(phase: Phase, client: redis.Redis, sf: stampede.Stampede, start_at: float) -> PhaseRecord:
    record = PhaseRecord()
    request = _requester(phase, client, sf, record, start_at)
    delay = start_at - time.time()
    if delay > 0:
        time.sleep(delay)
    record.start_delays.append(time.time() - start_at)
    deadline = start_at + phase.duration
    while True:
        started = time.perf_counter()
        try:
            request()
        except Exception as exc:
            record.errors.append(f"{type(exc).__name__}: {exc}")
        else:
            record.latencies.append(time.perf_counter() - started)
            record.ends.append(time.time() - start_at)
        if time.time() >= deadline:
            return record
        if phase.think:
            time.sleep(phase.think)


def _caller(
    phases: Sequence[Phase],
    barrier: Barrier,
    start_times: Sequence[float],
    client: redis.Redis,
    sf: stampede.Stampede,
    records: list[PhaseRecord],
    failures: list[str],
) -> None:
    timeout = barrier_timeout(phases)
    try:
        for index, phase in enumerate(phases):
            barrier.wait(timeout)  # ready: every caller is done with the previous phase
            barrier.wait(timeout)  # go: the parent prepared the key and set the start time
            records.append(_run_phase(phase, client, sf, start_times[index]))
    except threading.BrokenBarrierError:
        return  # someone else failed or gave up; they report why
    except BaseException:
        failures.append(traceback.format_exc())
        barrier.abort()


# --- one worker process ------------------------------------------------------


def _warm_pool(client: redis.Redis, size: int) -> None:
    """Open ``size`` connections now, so that no measured request pays for a TCP connect.

    The pool connects (and checks) every connection it hands out.
    """
    pool = client.connection_pool
    connections = []
    try:
        for _ in range(size):
            connections.append(pool.get_connection())
    finally:
        for connection in connections:
            pool.release(connection)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    sys.exit(128 + signum)  # unwinds through the finally blocks: clients get closed


def worker_main(
    index: int,
    url: str,
    phases: Sequence[Phase],
    threads: int,
    barrier: Barrier,
    start_times: Sequence[float],
    reports: Queue[WorkerReport],
) -> None:
    """Entry point of a worker process: run ``threads`` callers through ``phases``,
    then put one :class:`WorkerReport` on ``reports``."""
    # The parent owns Ctrl-C: it aborts the barrier and stops us with SIGTERM.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    client = redis.Redis.from_url(url, socket_timeout=30.0, socket_connect_timeout=10.0)
    sf = stampede.Stampede(client, namespace=NAMESPACE)
    try:
        _warm_pool(client, threads + 4)
        failures: list[str] = []
        per_thread: list[list[PhaseRecord]] = [[] for _ in range(threads)]
        callers = [
            threading.Thread(
                target=_caller,
                args=(phases, barrier, start_times, client, sf, per_thread[n], failures),
                name=f"bench-caller-{index}.{n}",
                daemon=True,
            )
            for n in range(threads)
        ]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join()
        sf.close()  # let background refreshes finish: they add to the records
        if failures:
            reports.put(WorkerReport(index, error=failures[0]))
            return
        merged = [PhaseRecord() for _ in phases]
        for records in per_thread:
            # A caller that stopped early at a broken barrier has fewer records;
            # the parent has given up on this run then anyway.
            for total, record in zip(merged, records, strict=False):
                total.absorb(record)
        reports.put(WorkerReport(index, records=merged))
    except Exception:
        barrier.abort()
        reports.put(WorkerReport(index, error=traceback.format_exc()))
    finally:
        sf.close()
        client.close()
