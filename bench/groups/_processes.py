"""The grouppeers benchmark's worker processes, as the parent sees them: the messages they send
(``(kind, index, payload)``), waiting for them, and stopping them."""

from __future__ import annotations

import queue
import time
from collections.abc import Sequence
from multiprocessing.context import SpawnProcess
from multiprocessing.queues import Queue
from typing import Any

__all__ = ["JOIN_TIMEOUT", "REPORT_TIMEOUT", "START_TIMEOUT", "Message", "expect", "finish"]

#: Seconds to wait for workers to start, to report, to exit.
START_TIMEOUT = 120.0
REPORT_TIMEOUT = 60.0
JOIN_TIMEOUT = 15.0

#: A worker's message: what it is (``ready``, ``report``, ``round``, ``error``), the worker's index,
#: what it carries.
Message = tuple[str, int, Any]


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
