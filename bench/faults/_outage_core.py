"""The outage benchmark's core part: no web server, threads of one process calling a cache's
get-or-rebuild on a few keys while Redis goes away and comes back.

The callers: stampede's ``Stampede.get_or_rebuild`` with ``fail_open=True``, and dogpile.cache's
``region.get_or_create`` on its Redis backend as :mod:`bench.peers.dogpile` configures it (if
installed); each with the same socket timeouts, on a fresh redis-server of its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

import stampede
from stampede.testing import RedisServer

from .._common.installed import importable
from .._common.workload import make_value
from ..peers.base import STALE_TTL
from ._outages import Boundaries, Fault, Plan, Sample, inflict, reach

__all__ = ["CORE_PEERS", "CorePeer", "CoreRun", "call_through"]

NAMESPACE = "outage"
#: Seconds a value stays fresh: no expiry within a run.
TTL = 300

#: A call: the key and the rebuild to run on a miss; what the cache answered.
Call = Callable[[str, Callable[[], Any]], Any]


@dataclass(frozen=True)
class CorePeer:
    """A cache the core part drives: its label, the modules it needs, and how to open it on a
    Redis URL with a socket timeout (a call, and what closes it)."""

    name: str
    label: str
    modules: tuple[str, ...]
    open: Callable[[str, float], tuple[Call, Callable[[], None]]]

    def missing(self) -> list[str]:
        return [module for module in self.modules if not importable(module)]


def _stampede(url: str, timeout: float) -> tuple[Call, Callable[[], None]]:
    cache = stampede.Stampede.from_url(
        url,
        namespace=NAMESPACE,
        ttl=TTL,
        fail_open=True,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
    )
    return cache.get_or_rebuild, cache.close


def _dogpile(url: str, timeout: float) -> tuple[Call, Callable[[], None]]:
    from ..peers.dogpile import region

    # The peer's region, on a pool with this part's timeouts rather than the peer's long ones.
    pool = redis.ConnectionPool.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    chosen = region(pool, TTL, STALE_TTL)
    return chosen.get_or_create, pool.disconnect


CORE_PEERS: tuple[CorePeer, ...] = (
    CorePeer(
        "stampede",
        "stampede `get_or_rebuild`, `fail_open=True`",
        ("redis",),
        _stampede,
    ),
    CorePeer(
        "dogpile",
        "dogpile.cache `get_or_create`, `distributed_lock=True`",
        ("dogpile.cache", "redis"),
        _dogpile,
    ),
)


@dataclass(frozen=True)
class CoreRun:
    """What the callers of one run got, and when each rebuild began (wall clock)."""

    bounds: Boundaries
    samples: list[Sample]
    rebuilds: list[float]


def call_through(
    peer: CorePeer,
    fault: Fault,
    plan: Plan,
    *,
    threads: int,
    keys: int,
    rebuild_seconds: float,
    socket_timeout: float,
    warmup: float,
    log: Callable[[str], None],
) -> CoreRun:
    """``threads`` threads call ``peer`` on ``keys`` keys, each in turn from its own first one,
    through ``fault``; every key is cached before they start."""
    names = [f"item:{index}" for index in range(keys)]
    samples: list[Sample] = []
    rebuilds: list[float] = []
    lock = threading.Lock()
    value = make_value()

    def rebuild() -> dict[str, Any]:
        with lock:
            rebuilds.append(time.time())
        time.sleep(rebuild_seconds)
        return value

    with RedisServer() as server, reach(server, fault) as (url, proxy):
        call, close = peer.open(url, socket_timeout)
        try:
            for name in names:
                call(name, rebuild)
            stop = threading.Event()

            def caller(first: int) -> None:
                turn = first
                while not stop.is_set():
                    name = names[turn % keys]
                    turn += 1
                    start = time.time()
                    clock = time.perf_counter()
                    try:
                        call(name, rebuild)
                        outcome = "ok"
                    except Exception as exc:  # counted, and the loop goes on, as a request handler's would
                        outcome = type(exc).__name__
                    sample = Sample(start, time.perf_counter() - clock, outcome)
                    with lock:
                        samples.append(sample)

            workers = [
                threading.Thread(target=caller, args=(index,), name=f"outage-caller-{index}", daemon=True)
                for index in range(threads)
            ]
            for worker in workers:
                worker.start()
            time.sleep(warmup)
            bounds = inflict(server, fault, plan, log, proxy)
            stop.set()
            deadline = time.monotonic() + 120.0
            for worker in workers:
                worker.join(max(0.0, deadline - time.monotonic()))
        finally:
            close()
        with lock:
            return CoreRun(bounds, list(samples), list(rebuilds))
