"""Near hit: what a hit served from process memory costs, beside the in-process floor and the peers.

``python -m bench nearhit [--rounds 5] [--calls 20000]`` starts its own redis-server. One process, one
thread (then one asyncio task), one key holding a small dict. Each variant is a zero-argument callable
(a coroutine function for asyncio) making one hit. Each round runs every variant ``--calls`` times in
chunks of :data:`CHUNK` calls, the variants alternating chunk by chunk (so that a noisy neighbour or a
frequency change hits them all alike), the order rotating every round; a variant's figure is the
median over the rounds of its mean time per call (``time.perf_counter``), and each is compared with
its floor:

- in process: ``pickle.loads(d[key])`` on a plain dict, a lookup and an unpickle (each caller gets a
  value of its own, as from every cache here but cachetools' plain lookup);
- remote: ``GET`` of the very Redis key stampede stores, with a plain redis-py client, and
  ``pickle.loads`` of the pickle in it: equal bytes over the wire;
- asyncio: the in-process floor inside a coroutine.

The rows: the floor; Django's ``LocMemCache``; cachetools' ``TTLCache``; stampede's core with a near
cache, unsigned and signed; Django's ``StampedeCache`` with one; redis-py's client-side cache; then
remote hits beside their floor: stampede's core, Django's own ``RedisCache`` and ``StampedeCache``
without a near cache; then asyncio: stampede.asyncio with a near cache and coredis's client-side cache.

The near caches are warmed and checked first: each is read until its invalidation connection is live
and it holds the copy, and the server's ``total_commands_processed`` shows what a hit sends (0 for a
hit from memory). The times include the timing loop's call of a Python function, the same for every
row. A peer whose package (or server: redis-py's client-side cache needs Redis 7.4 or later) is
missing is left out with a note.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import pickle
import platform
import shlex
import statistics
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

import stampede
import stampede.asyncio
from stampede.testing import RedisServer, find_redis_server

from .._common import timing
from .._common.installed import importable
from .._common.report import Table, render_table
from .._common.timing import atimer, timer
from ._variants import (
    ASYNC_FLOOR,
    ASYNC_NEAR,
    CORE_NEAR,
    CORE_REMOTE,
    DJANGO_NEAR,
    FLOOR,
    KEY,
    LOCMEM,
    REMOTE_FLOOR,
    TTL,
    VALUE,
    Variant,
    arebuild,
    await_live,
    cachetools_variants,
    core_variants,
    django_variants,
    floor_variants,
    redis_py_cache_variants,
)

__all__ = ["main"]

#: Calls of one variant before the next one's turn.
CHUNK = 1000


@dataclass(frozen=True)
class Measured:
    """A section's results: its rows in order, each one's seconds per call by round, and the
    commands a call sent to its server (for the rows that talk to one)."""

    variants: list[Variant]
    times: dict[str, list[float]]
    commands: dict[str, float]


# --- timing ------------------------------------------------------------------------


def interleave(variants: Sequence[Variant], rounds: int, calls: int) -> dict[str, list[float]]:
    """Mean seconds per call of each variant, one figure per round."""
    timers = {variant.name: timer(variant.call) for variant in variants}
    return timing.interleave(timers, rounds, calls, chunk=CHUNK)


async def ainterleave(variants: Sequence[Variant], rounds: int, calls: int) -> dict[str, list[float]]:
    """The asyncio twin of :func:`interleave`."""
    timers = {variant.name: atimer(variant.call) for variant in variants}
    return await timing.ainterleave(timers, rounds, calls, chunk=CHUNK, yielding=True)


# --- checks --------------------------------------------------------------------------


def _commands(server: redis.Redis) -> int:
    return int(server.info("stats")["total_commands_processed"])


def commands_per_call(server: redis.Redis, call: Callable[[], Any], n: int = 500) -> float:
    """Commands the server processed per ``call()``, over ``n`` calls."""
    before = _commands(server)
    for _ in range(n):
        call()
    # The first INFO is counted too, by the second.
    return (_commands(server) - before - 1) / n


async def acommands_per_call(server: redis.Redis, call: Callable[[], Awaitable[Any]], n: int = 500) -> float:
    before = _commands(server)
    for _ in range(n):
        await call()
    return (_commands(server) - before - 1) / n


# --- asyncio -----------------------------------------------------------------------


async def async_section(url: str, admin: redis.Redis, rounds: int, calls: int, notes: list[str]) -> Measured:
    """The asyncio rows, timed on this loop: stampede.asyncio's near hit and coredis's client-side
    cache, beside the floor in a coroutine."""
    loads = pickle.loads
    store = {KEY: pickle.dumps(VALUE, pickle.HIGHEST_PROTOCOL)}

    async def floor() -> Any:
        return loads(store[KEY])

    client = redis.asyncio.Redis.from_url(url, socket_timeout=5)
    sf = stampede.asyncio.Stampede(client, namespace="anear", near_cache=True)
    coredis_peer: Any = None
    try:
        await sf.set(KEY, VALUE, ttl=TTL)
        get = sf.get_or_rebuild

        async def near() -> Any:
            return await get(KEY, arebuild)

        await await_live(sf, near, ASYNC_NEAR, notes)
        variants = [
            Variant(ASYNC_FLOOR, floor, ASYNC_FLOOR),
            Variant(ASYNC_NEAR, near, ASYNC_FLOOR, admin),
        ]
        if importable("coredis"):
            from ..peers.coredis import CoredisPeer

            # A pool of one deadlocks: the cache's invalidation connection is one of the pool's.
            coredis_peer = CoredisPeer(url, 4)
            await coredis_peer.open()
            coredis = coredis_peer.coredis
            await coredis.set(KEY, pickle.dumps(VALUE, pickle.HIGHEST_PROTOCOL), ex=TTL)
            cget: Callable[[str], Awaitable[Any]] = coredis.get

            async def coredis_hit() -> Any:
                return loads(await cget(KEY))

            for _ in range(5):
                await coredis_hit()
                await asyncio.sleep(0.01)  # its invalidation connection runs as a task of the loop
            variants.append(
                Variant("coredis client-side cache, `GET` + `pickle.loads`", coredis_hit, ASYNC_FLOOR, admin)
            )
        else:
            notes.append("coredis is not installed: its client-side cache's row is left out.")
        commands = {
            variant.name: await acommands_per_call(variant.server, variant.call)
            for variant in variants
            if variant.server is not None
        }
        times = await ainterleave(variants, rounds, calls)
    finally:
        if coredis_peer is not None:
            await coredis_peer.aclose()
        await sf.aclose()
        await client.aclose()
    return Measured(variants, times, commands)


# --- the blocking rows -------------------------------------------------------------


def sync_section(
    binary: str, url: str, rounds: int, calls: int, notes: list[str], stack: contextlib.ExitStack
) -> Measured:
    """The blocking rows: in-process ones first, then the remote ones."""
    client = redis.Redis.from_url(url, socket_timeout=5)
    plain = redis.Redis.from_url(url, socket_timeout=5)
    stack.callback(client.close)
    stack.callback(plain.close)
    near_django, remote_django = django_variants(url, client, notes)
    core = core_variants(client, plain, notes, stack)
    variants = [
        *floor_variants(),
        *[v for v in near_django if v.floor == FLOOR and v.server is None],
        *cachetools_variants(notes),
        *[v for v in core if v.floor == FLOOR],
        *[v for v in near_django if v.server is not None],
        *redis_py_cache_variants(binary, url, notes, stack),
        *[v for v in core if v.floor == REMOTE_FLOOR],
        *remote_django,
    ]
    commands = {
        variant.name: commands_per_call(variant.server, variant.call)
        for variant in variants
        if variant.server is not None
    }
    return Measured(variants, interleave(variants, rounds, calls), commands)


# --- output ------------------------------------------------------------------------

#: The targets: their name, the row and the row it is compared with, and the most that ratio may be.
TARGETS = (
    ("core near hit / floor", CORE_NEAR, FLOOR, 3.0),
    ("Django near `get` / `LocMemCache.get`", DJANGO_NEAR, LOCMEM, 1.5),
    ("remote hit / (`GET` + unpickle)", CORE_REMOTE, REMOTE_FLOOR, 1.03),
)


def _ratio_range(times: dict[str, list[float]], top: str, bottom: str) -> tuple[float, float, float]:
    """The ratio of the medians, and the least and greatest ratio of a round."""
    per_round = [t / b for t, b in zip(times[top], times[bottom], strict=True)]
    return statistics.median(times[top]) / statistics.median(times[bottom]), min(per_round), max(per_round)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench nearhit",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20_000, help="calls per variant per round")
    args = parser.parse_args(argv)
    command = shlex.join(["python", "-m", "bench", "nearhit", *(sys.argv[1:] if argv is None else argv)])
    notes: list[str] = []
    with contextlib.ExitStack() as stack:
        binary = find_redis_server()
        server = stack.enter_context(RedisServer(binary=binary))
        admin = redis.Redis.from_url(server.url)
        stack.callback(admin.close)
        version = admin.info("server")["redis_version"]
        blocking = sync_section(binary, server.url, args.rounds, args.calls, notes, stack)
        in_asyncio = asyncio.run(async_section(server.url, admin, args.rounds, args.calls, notes))
    times = {**blocking.times, **in_asyncio.times}
    commands = {**blocking.commands, **in_asyncio.commands}
    rows = []
    for variant in [*blocking.variants, *in_asyncio.variants]:
        median = statistics.median(times[variant.name])
        ratio = median / statistics.median(times[variant.floor])
        sent = commands.get(variant.name)
        rows.append(
            [
                variant.name,
                f"{median * 1e6:.2f}",
                "1.00x" if variant.name == variant.floor else f"{ratio:.2f}x",
                variant.floor,
                "-" if sent is None else f"{sent:.2f}",
            ]
        )
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"## What a hit costs: redis-server {version}\n")
    print(f"`{command}`, {now} · Python {platform.python_version()}\n")
    print(
        f"A small dict, {args.rounds} round{'' if args.rounds == 1 else 's'} x {args.calls} calls per "
        f"variant, alternating every {CHUNK} calls; median over the rounds of the mean time per call.\n"
    )
    print(
        render_table(
            Table(
                headers=["variant", "µs per hit", "ratio to its floor", "floor", "Redis commands per hit"],
                rows=rows,
                align="lrrlr",
            )
        )
    )
    target_rows = []
    for title, top, bottom, most in TARGETS:
        if top not in times or bottom not in times:
            continue
        ratio, low, high = _ratio_range(times, top, bottom)
        met = round(ratio, 2) <= most  # judged as shown, to 0.01x
        target_rows.append(
            [
                title,
                f"{ratio:.2f}x",
                f"{low:.2f}x - {high:.2f}x",
                f"<= {most:.2f}x",
                "met" if met else "NOT met",
            ]
        )
    print("\n### Targets\n")
    print(
        render_table(
            Table(
                headers=["ratio", "measured", "per-round range", "target", ""],
                rows=target_rows,
                align="lrrrl",
            )
        )
    )
    if notes:
        print()
        print("\n".join(f"- {note}" for note in notes))
