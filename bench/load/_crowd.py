"""N callers released at the same instant: threads behind a barrier, or tasks behind an event.

Each caller's latency runs from its own call to its return or its error. A
caller that has not answered ``timeout`` seconds after the release counts as
an error, and the crowd returns without it: nothing here waits forever.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["CallError", "Outcome", "describe", "in_tasks", "in_threads", "no_answer", "timed_out"]

T = TypeVar("T")

#: Seconds the threads have to get ready (connect, say) before the release.
READY_TIMEOUT = 60.0


@dataclass(frozen=True)
class Outcome:
    """One caller's call: how long it took, and what went wrong if anything did."""

    latency: float
    error: str | None = None


class CallError(Exception):
    """A failed call the benchmark words itself (``HTTP 500``, a client timeout): shown as its
    message alone."""


def no_answer(timeout: float) -> str:
    return f"no answer within {timeout:g} s"


def timed_out(timeout: float) -> Outcome:
    return Outcome(timeout, no_answer(timeout))


def describe(exc: BaseException) -> str:
    """One line for an error: its type and message, whitespace squeezed."""
    message = " ".join(str(exc).split())
    if isinstance(exc, CallError):
        return message
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def in_threads(
    n: int, prepare: Callable[[], T], call: Callable[[T], object], *, timeout: float
) -> list[Outcome]:
    """Run ``call(prepare())`` in ``n`` threads; every ``prepare`` is done before any ``call`` starts."""
    outcomes: list[Outcome | None] = [None] * n
    barrier = threading.Barrier(n + 1)

    def ready() -> bool:
        try:
            barrier.wait(READY_TIMEOUT)
        except threading.BrokenBarrierError:
            return False
        return True

    def caller(index: int) -> None:
        try:
            state = prepare()
        except Exception as exc:
            outcomes[index] = Outcome(0.0, describe(exc))
            ready()  # still counted at the barrier, so the others are released
            return
        if not ready():
            return
        started = time.perf_counter()
        try:
            call(state)
        except Exception as exc:
            outcomes[index] = Outcome(time.perf_counter() - started, describe(exc))
        else:
            outcomes[index] = Outcome(time.perf_counter() - started)

    threads = [
        threading.Thread(target=caller, args=(index,), name=f"bench-many-{index}", daemon=True)
        for index in range(n)
    ]
    for thread in threads:
        thread.start()
    barrier.wait(READY_TIMEOUT)
    deadline = time.monotonic() + timeout + 1.0  # a second's grace for the last answers to be noted
    for thread in threads:
        # Threads cannot be stopped: one that is stuck is left behind (a daemon) and counted below.
        thread.join(max(0.0, deadline - time.monotonic()))
    return [outcome or timed_out(timeout) for outcome in outcomes]


async def in_tasks(n: int, call: Callable[[], Awaitable[object]], *, timeout: float) -> list[Outcome]:
    """Run ``call()`` in ``n`` tasks on the running loop, all started by one event."""
    go = asyncio.Event()

    async def caller() -> Outcome:
        await go.wait()
        started = time.perf_counter()
        try:
            await asyncio.wait_for(call(), timeout)
        except asyncio.TimeoutError:  # TimeoutError itself only from Python 3.11
            return timed_out(timeout)
        except Exception as exc:
            return Outcome(time.perf_counter() - started, describe(exc))
        return Outcome(time.perf_counter() - started)

    tasks = [asyncio.create_task(caller()) for _ in range(n)]
    await asyncio.sleep(0)  # every task now waits on the event
    go.set()
    return list(await asyncio.gather(*tasks))
