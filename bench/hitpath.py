"""Scenario 1: what a hit costs, against a plain GET + unpickle on the same client.

One client, one thread (so one connection), a fresh key holding a small
dict. Each of ``rounds`` rounds makes ``calls`` calls per variant, in
chunks of :data:`CHUNK` calls that alternate between the variants (so a
noisy neighbour or a frequency change hits every variant alike), with the
order rotating every round; each variant's result is the median of its
per-call times over the rounds.
"""

from __future__ import annotations

import asyncio
import pickle
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis
import redis.asyncio

import stampede
import stampede.asyncio

from ._stats import median
from ._workload import NAMESPACE, key_prefix, make_value
from .report import Section, Table, micros

__all__ = ["run"]

TTL = 3600
CHUNK = 250
#: The target: a hit costs at most this much more than the baseline.
TARGET_RATIO = 1.1

BASELINE = "`client.get(key)` + `pickle.loads` (baseline)"
PER_CALL = "`get_or_rebuild(key, rebuild, ttl=3600)`"
DEFAULTS = "`get_or_rebuild(key, rebuild)`, `ttl=3600` set on the instance"


@dataclass(frozen=True)
class _Timing:
    driver: str
    variant: str
    per_call: list[float]  # seconds per call, one per round

    @property
    def median(self) -> float:
        return median(self.per_call)


def run(url: str, *, run_id: str, rounds: int, calls: int) -> Section:
    key = f"{key_prefix(run_id)}hit"
    timings = [
        *_sync(url, f"{key}:sync", rounds, calls),
        *asyncio.run(_async(url, f"{key}:async", rounds, calls)),
    ]
    baselines = {t.driver: t.median for t in timings if t.variant == BASELINE}
    rows = [
        [
            t.driver,
            t.variant,
            micros(t.median),
            micros(min(t.per_call)),
            micros(max(t.per_call)),
            f"{t.median / baselines[t.driver]:.2f}x",
        ]
        for t in timings
    ]
    verdicts = [
        f"{t.driver} {t.variant}: {t.median / baselines[t.driver]:.2f}x"
        for t in timings
        if t.variant == PER_CALL
    ]
    met = all(t.median / baselines[t.driver] <= TARGET_RATIO for t in timings if t.variant == PER_CALL)
    return Section(
        title="1. Hit path, one client",
        intro=(
            f"A fresh key holding a 10-field dict; {rounds} rounds x {calls} calls per variant on one "
            f"client and connection, the variants alternating every {CHUNK} calls. Times are per call; "
            "`vs baseline` compares the medians."
        ),
        table=Table(
            headers=[
                "driver",
                "read",
                f"median of {rounds} rounds",
                "best round",
                "worst round",
                "vs baseline",
            ],
            rows=rows,
            align="llrrrr",
        ),
        notes=[
            f"Target: a stampede hit at most {TARGET_RATIO:.1f}x the baseline: {'met' if met else 'NOT met'} "
            f"({'; '.join(verdicts)})."
        ],
    )


def _never(what: str) -> Callable[[], Any]:
    def rebuild() -> Any:
        raise AssertionError(f"the hit path benchmark rebuilt {what}: the key was not fresh")

    return rebuild


# --- sync --------------------------------------------------------------------


def _sync(url: str, key: str, rounds: int, calls: int) -> list[_Timing]:
    client = redis.Redis.from_url(url, socket_timeout=10.0)
    try:
        sf = stampede.Stampede(client, namespace=NAMESPACE)
        sf_defaults = stampede.Stampede(client, namespace=NAMESPACE, ttl=TTL)
        value = make_value()
        plain_key = f"{key}:plain"
        sf.set(key, value, ttl=TTL)
        client.set(plain_key, pickle.dumps(value, pickle.HIGHEST_PROTOCOL))
        rebuild = _never(key)

        def baseline(n: int) -> float:
            get: Callable[[str], bytes] = client.get  # type: ignore[assignment]
            loads = pickle.loads
            started = time.perf_counter()
            for _ in range(n):
                loads(get(plain_key))
            return time.perf_counter() - started

        def per_call(n: int) -> float:
            get = sf.get_or_rebuild
            started = time.perf_counter()
            for _ in range(n):
                get(key, rebuild, ttl=TTL)
            return time.perf_counter() - started

        def defaults(n: int) -> float:
            get = sf_defaults.get_or_rebuild
            started = time.perf_counter()
            for _ in range(n):
                get(key, rebuild)
            return time.perf_counter() - started

        if (
            sf.get_or_rebuild(key, rebuild, ttl=TTL) != value
            or pickle.loads(cast(bytes, client.get(plain_key))) != value
        ):
            raise RuntimeError("the hit path benchmark read back something other than what it stored")
        variants = {BASELINE: baseline, PER_CALL: per_call, DEFAULTS: defaults}
        per_round = _interleave(variants, rounds, calls)
        return [_Timing("sync", name, times) for name, times in per_round.items()]
    finally:
        client.close()


def _interleave(
    variants: Mapping[str, Callable[[int], float]], rounds: int, calls: int
) -> dict[str, list[float]]:
    """Per-call seconds of each variant (``variants[name](n)`` times ``n`` calls), one per round."""
    names = list(variants)
    for name in names:  # warm up: connection, caches, branch predictors
        variants[name](CHUNK)
    times: dict[str, list[float]] = {name: [] for name in names}
    for order in _orders(names, rounds):
        elapsed = dict.fromkeys(names, 0.0)
        for size in _chunks(calls):
            for name in order:
                elapsed[name] += variants[name](size)
        for name in names:
            times[name].append(elapsed[name] / calls)
    return times


def _chunks(calls: int) -> list[int]:
    return [min(CHUNK, calls - done) for done in range(0, calls, CHUNK)]


def _orders(names: Sequence[str], rounds: int) -> list[list[str]]:
    """The order of the variants in each round: rotated, so each runs first as often as the others."""
    return [[*names[r % len(names) :], *names[: r % len(names)]] for r in range(rounds)]


# --- asyncio -----------------------------------------------------------------


async def _async(url: str, key: str, rounds: int, calls: int) -> list[_Timing]:
    client = redis.asyncio.Redis.from_url(url, socket_timeout=10.0)
    try:
        sf = stampede.asyncio.Stampede(client, namespace=NAMESPACE)
        sf_defaults = stampede.asyncio.Stampede(client, namespace=NAMESPACE, ttl=TTL)
        value = make_value()
        plain_key = f"{key}:plain"
        await sf.set(key, value, ttl=TTL)
        await client.set(plain_key, pickle.dumps(value, pickle.HIGHEST_PROTOCOL))
        rebuild = _never(key)

        async def baseline(n: int) -> float:
            get: Callable[[str], Awaitable[bytes]] = client.get  # type: ignore[assignment]
            loads = pickle.loads
            started = time.perf_counter()
            for _ in range(n):
                loads(await get(plain_key))
            return time.perf_counter() - started

        async def per_call(n: int) -> float:
            get = sf.get_or_rebuild
            started = time.perf_counter()
            for _ in range(n):
                await get(key, rebuild, ttl=TTL)
            return time.perf_counter() - started

        async def defaults(n: int) -> float:
            get = sf_defaults.get_or_rebuild
            started = time.perf_counter()
            for _ in range(n):
                await get(key, rebuild)
            return time.perf_counter() - started

        if await sf.get_or_rebuild(key, rebuild, ttl=TTL) != value:
            raise RuntimeError("the hit path benchmark read back something other than what it stored")
        variants = {BASELINE: baseline, PER_CALL: per_call, DEFAULTS: defaults}
        per_round = await _ainterleave(variants, rounds, calls)
        return [_Timing("asyncio", name, times) for name, times in per_round.items()]
    finally:
        await client.aclose()


async def _ainterleave(
    variants: Mapping[str, Callable[[int], Awaitable[float]]], rounds: int, calls: int
) -> dict[str, list[float]]:
    """The asyncio twin of :func:`_interleave`."""
    names = list(variants)
    for name in names:
        await variants[name](CHUNK)
    times: dict[str, list[float]] = {name: [] for name in names}
    for order in _orders(names, rounds):
        elapsed = dict.fromkeys(names, 0.0)
        for size in _chunks(calls):
            for name in order:
                elapsed[name] += await variants[name](size)
        for name in names:
            times[name].append(elapsed[name] / calls)
    return times
