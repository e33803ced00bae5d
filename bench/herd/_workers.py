"""What the benchmark's child processes run.

Everything a child needs is defined at module level, so that the "spawn"
start method can import it in a fresh interpreter. Each worker process builds
every peer its phases use (one client or cache object per peer and process,
shared by its callers, as an application would), then starts its caller
threads; if a peer is driven by asyncio, it also runs one event loop in a
thread of its own, on which that peer's callers are tasks.

All callers of all processes run the same list of :class:`Phase` in step:
three rounds of a shared barrier per phase (everyone is done with the
previous phase; the key is warm if it should be; the parent has set the
start time), then each caller sleeps until the agreed start time and sends
its requests. A caller thread stands for its process's tasks too: in a phase
of an asyncio peer, the first thread of each process runs all the tasks on
the loop and the other threads only keep the barrier's count.
"""

from __future__ import annotations

import asyncio
import functools
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from types import FrameType
from typing import Any, TypeVar, cast

import redis

from .._common.phase import Phase, PhaseRecord
from .._common.timing import ainterleave, interleave
from .._common.workload import make_value
from ..peers import AsyncPeer, SyncPeer, open_async, open_sync, spec, warm_pool
from . import hitpath

__all__ = ["Setup", "WorkerReport", "barrier_timeout", "worker_main"]

T = TypeVar("T")


@dataclass(frozen=True)
class Setup:
    """What every worker needs besides the phases: the Redis URL of each peer (its own
    server, or one shared), the prefix of every key of the run, callers per process."""

    urls: Mapping[str, str]
    prefix: str
    threads: int


@dataclass(frozen=True)
class WorkerReport:
    """A worker's message to the parent: one record per phase, or what went wrong."""

    index: int
    records: list[PhaseRecord] | None = None
    error: str | None = None


def barrier_timeout(phases: Sequence[Phase]) -> float:
    """How long anyone waits at the barrier before giving up: the longest phase, plus slack
    for spawning the processes (importing every peer) and for slow machines."""
    return 60.0 + max((p.budget for p in phases), default=0.0)


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


async def _arebuild(client: Any, phase: Phase, rebuilds: list[tuple[float, float]], start_at: float) -> Any:
    """:func:`_rebuild` as a coroutine, as an asyncio application would write it."""
    started = time.time()
    await client.incr(phase.counter_key)
    await asyncio.sleep(phase.rebuild_seconds)
    rebuilds.append((started - start_at, time.time() - start_at))
    return make_value()


def _never(phase: Phase) -> Callable[[], Any]:
    def rebuild() -> Any:
        raise AssertionError(f"the hit path benchmark rebuilt {phase.key}: the key was not fresh")

    return rebuild


def _anever(phase: Phase) -> Callable[[], Awaitable[Any]]:
    sync = _never(phase)

    async def rebuild() -> Any:
        return sync()

    return rebuild


async def _amake_value() -> Any:
    return make_value()


def _check(value: Any, phase: Phase) -> None:
    if value != make_value():
        raise RuntimeError(f"{phase.peer} read back something other than what was stored under {phase.key}")


# --- the worker's state ------------------------------------------------------


class _Worker:
    """One worker process: its clients, its peers, its event loop if it needs one."""

    def __init__(self, index: int, setup: Setup, phases: Sequence[Phase]) -> None:
        self.index = index
        self.setup = setup
        self.phases = phases
        self.clients: dict[str, redis.Redis] = {}  # by URL: counters, baselines, plain peers
        self.sync_peers: dict[str, SyncPeer] = {}
        self.async_peers: dict[str, AsyncPeer] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None

    @property
    def pool_size(self) -> int:
        return self.setup.threads + 4

    def open(self) -> None:
        names = list(dict.fromkeys(phase.peer for phase in self.phases))
        for name in names:
            url = self.setup.urls[name]
            if url not in self.clients:
                client = redis.Redis.from_url(url, socket_timeout=30.0, socket_connect_timeout=10.0)
                self.clients[url] = client
                warm_pool(client.connection_pool, self.pool_size)
            if spec(name).is_async:
                self.async_peers[name] = self.on_loop(open_async(name, url, pool_size=self.pool_size))
            else:
                self.sync_peers[name] = open_sync(
                    name,
                    url,
                    prefix=self.setup.prefix,
                    phases=[phase for phase in self.phases if phase.peer == name],
                    client=self.clients[url],
                    pool_size=self.pool_size,
                )

    def on_loop(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` on the worker's event loop (started on first use) and wait for it."""
        if self.loop is None:
            loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(target=loop.run_forever, name="bench-loop", daemon=True)
            self._loop_thread.start()
            self.loop = loop
        return asyncio.run_coroutine_threadsafe(work, self.loop).result()

    def drain(self) -> None:
        """Let background refreshes finish: they add to the records."""
        for peer in self.sync_peers.values():
            peer.drain()
        for apeer in self.async_peers.values():
            self.on_loop(apeer.drain())

    def close(self) -> None:
        for peer in self.sync_peers.values():
            peer.close()
        if self.loop is not None:
            for apeer in self.async_peers.values():
                self.on_loop(apeer.aclose())
            self.loop.call_soon_threadsafe(self.loop.stop)
            if self._loop_thread is not None:
                self._loop_thread.join(10.0)
            self.loop.close()
        for client in self.clients.values():
            client.close()

    # --- a phase, as one caller thread sees it --------------------------------

    def warm(self, phase: Phase) -> None:
        """Fill the key through the peer (the rebuild is not counted), and the baseline's key."""
        url = self.setup.urls[phase.peer]
        if phase.scenario == "hit":
            self.clients[url].set(f"{phase.key}:plain", pickle.dumps(make_value(), pickle.HIGHEST_PROTOCOL))
        if phase.peer in self.async_peers:
            self.on_loop(self._awarm(self.async_peers[phase.peer], phase))
            return
        with self.sync_peers[phase.peer].session(phase, make_value) as request:
            _check(request(), phase)
            if phase.scenario == "hit":
                _check(request(), phase)  # a hit now

    async def _awarm(self, peer: AsyncPeer, phase: Phase) -> None:
        async with peer.session(phase, _amake_value) as request:
            _check(await request(), phase)
            if phase.scenario == "hit":
                _check(await request(), phase)

    def run(self, phase: Phase, caller: int, start_at: float) -> PhaseRecord:
        """What caller thread ``caller`` of this process does in ``phase``."""
        if phase.scenario == "hit":
            if self.index != 0 or caller != 0:
                return PhaseRecord()  # a single caller times the hit path, undisturbed
            if phase.peer in self.async_peers:
                return self.on_loop(self._ahit(self.async_peers[phase.peer], phase))
            return self._hit(self.sync_peers[phase.peer], phase)
        if phase.peer in self.async_peers:
            if caller != 0:
                return PhaseRecord()
            return self.on_loop(self._atasks(self.async_peers[phase.peer], phase, start_at))
        return self._load(self.sync_peers[phase.peer], phase, start_at)

    def _load(self, peer: SyncPeer, phase: Phase, start_at: float) -> PhaseRecord:
        record = PhaseRecord()
        client = self.clients[self.setup.urls[phase.peer]]
        rebuild = functools.partial(_rebuild, client, phase, record.rebuilds, start_at)
        with peer.session(phase, rebuild) as request:
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

    async def _atasks(self, peer: AsyncPeer, phase: Phase, start_at: float) -> PhaseRecord:
        """The process's callers of an asyncio peer: one task each, on this loop."""
        records = await asyncio.gather(
            *(self._atask(peer, phase, start_at) for _ in range(self.setup.threads))
        )
        merged = PhaseRecord()
        for record in records:
            merged.absorb(record)
        return merged

    async def _atask(self, peer: AsyncPeer, phase: Phase, start_at: float) -> PhaseRecord:
        record = PhaseRecord()
        rebuild = functools.partial(_arebuild, peer.client, phase, record.rebuilds, start_at)
        async with peer.session(phase, rebuild) as request:
            delay = start_at - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            record.start_delays.append(time.time() - start_at)
            deadline = start_at + phase.duration
            while True:
                started = time.perf_counter()
                try:
                    await request()
                except Exception as exc:
                    record.errors.append(f"{type(exc).__name__}: {exc}")
                else:
                    record.latencies.append(time.perf_counter() - started)
                    record.ends.append(time.time() - start_at)
                if time.time() >= deadline:
                    return record
                if phase.think:
                    await asyncio.sleep(phase.think)

    def _hit(self, peer: SyncPeer, phase: Phase) -> PhaseRecord:
        client = self.clients[self.setup.urls[phase.peer]]
        plain_key = f"{phase.key}:plain"
        with peer.session(phase, _never(phase)) as request:

            def baseline(n: int) -> float:
                get = cast("Callable[[str], bytes]", client.get)
                loads = pickle.loads
                started = time.perf_counter()
                for _ in range(n):
                    loads(get(plain_key))
                return time.perf_counter() - started

            def cached(n: int) -> float:
                started = time.perf_counter()
                for _ in range(n):
                    request()
                return time.perf_counter() - started

            variants = {hitpath.BASELINE: baseline, hitpath.PEER: cached}
            times = interleave(variants, phase.rounds, phase.calls, chunk=hitpath.CHUNK)
        return PhaseRecord(hit_times=times, hit_calls=hitpath.calls_made(variants, phase.rounds, phase.calls))

    async def _ahit(self, peer: AsyncPeer, phase: Phase) -> PhaseRecord:
        client = peer.client
        plain_key = f"{phase.key}:plain"
        async with peer.session(phase, _anever(phase)) as request:

            async def baseline(n: int) -> float:
                get = client.get
                loads = pickle.loads
                started = time.perf_counter()
                for _ in range(n):
                    loads(await get(plain_key))
                return time.perf_counter() - started

            async def cached(n: int) -> float:
                started = time.perf_counter()
                for _ in range(n):
                    await request()
                return time.perf_counter() - started

            variants = {hitpath.BASELINE: baseline, hitpath.PEER: cached}
            times = await ainterleave(variants, phase.rounds, phase.calls, chunk=hitpath.CHUNK)
        return PhaseRecord(hit_times=times, hit_calls=hitpath.calls_made(variants, phase.rounds, phase.calls))


# --- one caller thread -------------------------------------------------------


def _caller(
    worker: _Worker,
    caller: int,
    barrier: Barrier,
    start_times: Sequence[float],
    records: list[PhaseRecord],
    failures: list[str],
) -> None:
    timeout = barrier_timeout(worker.phases)
    try:
        for index, phase in enumerate(worker.phases):
            barrier.wait(timeout)  # ready: every caller is done with the previous phase
            if phase.warm and worker.index == 0 and caller == 0:
                worker.warm(phase)
            barrier.wait(timeout)  # warmed: the key holds a fresh value if the phase wants one
            barrier.wait(timeout)  # go: the parent has set the start time
            records.append(worker.run(phase, caller, start_times[index]))
    except threading.BrokenBarrierError:
        return  # someone else failed or gave up; they report why
    except BaseException:
        failures.append(traceback.format_exc())
        barrier.abort()


# --- one worker process ------------------------------------------------------


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    sys.exit(128 + signum)  # unwinds through the finally blocks: clients get closed


def worker_main(
    index: int,
    setup: Setup,
    phases: Sequence[Phase],
    barrier: Barrier,
    start_times: Sequence[float],
    reports: Queue[WorkerReport],
) -> None:
    """Entry point of a worker process: run ``setup.threads`` callers through ``phases``,
    then put one :class:`WorkerReport` on ``reports``."""
    # The parent owns Ctrl-C: it aborts the barrier and stops us with SIGTERM.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    worker = _Worker(index, setup, phases)
    try:
        worker.open()
        failures: list[str] = []
        per_thread: list[list[PhaseRecord]] = [[] for _ in range(setup.threads)]
        callers = [
            threading.Thread(
                target=_caller,
                args=(worker, n, barrier, start_times, per_thread[n], failures),
                name=f"bench-caller-{index}.{n}",
                daemon=True,
            )
            for n in range(setup.threads)
        ]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join()
        worker.drain()
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
        worker.close()
