"""Parent side of the multi-process load: spawn the workers, start every phase
at once on all of them, collect what they measured, and always stop them."""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier

from .._common.phase import Phase, PhaseRecord
from ._workers import Setup, WorkerReport, barrier_timeout, worker_main

__all__ = ["WorkerError", "run_phases"]

#: Seconds between setting a phase's start time and that time: enough for the
#: barrier to release every caller of every process before it.
START_LEAD = 0.3


class WorkerError(RuntimeError):
    """A worker process failed; the message carries its traceback."""


def run_phases(
    setup: Setup,
    phases: Sequence[Phase],
    *,
    processes: int,
    on_start: Callable[[int], None] | None = None,
    on_end: Callable[[int], None] | None = None,
) -> list[PhaseRecord]:
    """Run ``phases`` in order on ``processes`` x ``setup.threads`` callers; one merged record per phase.

    ``on_start(i)`` runs in this process once phase ``i``'s key is ready and
    just before the phase starts; ``on_end(i)`` once every caller has finished
    it (for the last phase: once every worker has exited). Both see every
    caller idle: they are the place to sample a server's counters.
    """
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes * setup.threads + 1)  # every caller, and us
    start_times = ctx.Array("d", len(phases), lock=False)
    reports: Queue[WorkerReport] = ctx.Queue()
    timeout = barrier_timeout(phases)
    workers = [
        ctx.Process(
            target=worker_main,
            args=(index, setup, list(phases), barrier, start_times, reports),
            name=f"bench-worker-{index}",
        )
        for index in range(processes)
    ]
    grace = 0.0  # unless all goes well: then the workers are exiting by themselves
    try:
        for worker in workers:
            worker.start()
        for index in range(len(phases)):
            _wait(barrier, timeout, reports)  # every caller is done with the previous phase
            if index and on_end is not None:
                on_end(index - 1)
            _wait(barrier, timeout, reports)  # the key is warm, if the phase wants it so
            if on_start is not None:
                on_start(index)
            start_times[index] = time.time() + START_LEAD
            _wait(barrier, timeout, reports)  # go
        records = _collect(reports, workers, len(phases), timeout)
        if phases and on_end is not None:
            on_end(len(phases) - 1)
        grace = 10.0
        return records
    except BaseException:
        barrier.abort()  # release anyone still waiting
        raise
    finally:
        _stop(workers, grace)
        reports.close()


def _wait(barrier: Barrier, timeout: float, reports: Queue[WorkerReport]) -> None:
    try:
        barrier.wait(timeout)
    except threading.BrokenBarrierError:
        raise WorkerError(_errors(reports) or "a worker gave up waiting for the others") from None


def _errors(reports: Queue[WorkerReport], patience: float = 5.0) -> str:
    """The error reports that arrive within ``patience`` seconds, joined."""
    found: list[str] = []
    deadline = time.monotonic() + patience
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            report = reports.get(timeout=remaining)
        except queue.Empty:
            break
        if report.error is not None:
            found.append(f"worker {report.index}:\n{report.error}")
    return "\n".join(found)


def _collect(
    reports: Queue[WorkerReport], workers: Sequence[BaseProcess], phases: int, timeout: float
) -> list[PhaseRecord]:
    """Merge every worker's records, phase by phase; read before joining (the queue
    must be drained for a worker to exit)."""
    merged = [PhaseRecord() for _ in range(phases)]
    pending = len(workers)
    deadline = time.monotonic() + timeout
    while pending:
        try:
            report = reports.get(timeout=1.0)
        except queue.Empty:
            dead = [w.name for w in workers if w.exitcode not in (None, 0)]
            if dead:
                raise WorkerError(f"worker(s) {', '.join(dead)} died without reporting") from None
            if time.monotonic() > deadline:
                raise WorkerError(f"no report from {pending} worker(s) within {timeout:.0f}s") from None
            continue
        if report.error is not None or report.records is None:
            raise WorkerError(f"worker {report.index} failed:\n{report.error}")
        if len(report.records) != phases:
            raise WorkerError(f"worker {report.index} reported {len(report.records)} of {phases} phases")
        for total, record in zip(merged, report.records, strict=True):
            total.absorb(record)
        pending -= 1
    return merged


def _stop(workers: Sequence[BaseProcess], grace: float) -> None:
    """Join the workers; one still running after ``grace`` seconds gets SIGTERM,
    which it turns into a clean exit (closing its clients)."""
    give_up_at = time.monotonic() + grace
    for worker in workers:
        if worker.pid is not None:  # else never started
            worker.join(max(0.0, give_up_at - time.monotonic()))
    for worker in workers:
        if worker.is_alive():
            worker.terminate()
    for worker in workers:
        if worker.pid is not None:
            worker.join(10.0)
            if worker.is_alive():
                worker.kill()
                worker.join()
