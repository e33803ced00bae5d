"""Timing loops for the cost of a hit: the variants alternate chunk by chunk, so that a noisy
neighbour or a frequency change hits them all alike, and the order rotates every round, so that
each runs first as often as the others.

A variant is timed by a function of ``n`` that makes ``n`` calls and returns the seconds they
took (:func:`timer` makes one of a zero-argument callable); the result is, per variant, the mean
seconds per call of each round.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

__all__ = ["ainterleave", "atimer", "interleave", "timer"]


def timer(call: Callable[[], Any]) -> Callable[[int], float]:
    """What times ``n`` calls of ``call()``, by ``time.perf_counter``."""

    def timed(n: int) -> float:
        run = call  # a local, read faster than the closure's cell: the loop times the call alone
        started = time.perf_counter()
        for _ in range(n):
            run()
        return time.perf_counter() - started

    return timed


def atimer(call: Callable[[], Awaitable[Any]]) -> Callable[[int], Awaitable[float]]:
    """:func:`timer` for a coroutine function."""

    async def timed(n: int) -> float:
        run = call
        started = time.perf_counter()
        for _ in range(n):
            await run()
        return time.perf_counter() - started

    return timed


def _chunks(calls: int, chunk: int) -> list[int]:
    return [min(chunk, calls - done) for done in range(0, calls, chunk)]


def _orders(names: Sequence[str], rounds: int) -> list[list[str]]:
    """The order of the variants in each round: rotated, so each runs first as often as the others."""
    return [[*names[r % len(names) :], *names[: r % len(names)]] for r in range(rounds)]


def interleave(
    variants: Mapping[str, Callable[[int], float]], rounds: int, calls: int, *, chunk: int
) -> dict[str, list[float]]:
    """Per-call seconds of each variant, one per round: a warm-up chunk of each (connections,
    caches, branch predictors), then ``rounds`` rounds of ``calls`` calls each, in chunks."""
    names = list(variants)
    for name in names:
        variants[name](chunk)
    times: dict[str, list[float]] = {name: [] for name in names}
    for order in _orders(names, rounds):
        elapsed = dict.fromkeys(names, 0.0)
        for size in _chunks(calls, chunk):
            for name in order:
                elapsed[name] += variants[name](size)
        for name in names:
            times[name].append(elapsed[name] / calls)
    return times


async def ainterleave(
    variants: Mapping[str, Callable[[int], Awaitable[float]]],
    rounds: int,
    calls: int,
    *,
    chunk: int,
    yielding: bool = False,
) -> dict[str, list[float]]:
    """The asyncio twin of :func:`interleave`. With ``yielding``, the loop gets one turn after each
    chunk: a hit from memory never suspends, and a near cache's invalidation connection (and its
    heartbeat, without which copies stop being served) runs on the loop."""
    names = list(variants)
    for name in names:
        await variants[name](chunk)
    times: dict[str, list[float]] = {name: [] for name in names}
    for order in _orders(names, rounds):
        elapsed = dict.fromkeys(names, 0.0)
        for size in _chunks(calls, chunk):
            for name in order:
                elapsed[name] += await variants[name](size)
                if yielding:
                    await asyncio.sleep(0)
        for name in names:
            times[name].append(elapsed[name] / calls)
    return times
