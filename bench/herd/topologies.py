"""``python -m bench topologies``: the cold and hot scenarios on one server and on a 3-master cluster.

stampede alone, side by side in one run, on Redis 6.2 and Valkey 8: one
server, then a local cluster of 3 masters and 3 replicas. Callers are 4
instances (as 4 processes would be) of 16 threads.

- cold: every caller asks for one missing key at once; the rebuild takes
  200 ms. Reported: rebuilds, and the slowest caller's wait beyond the
  rebuild itself (the median over the trials).
- hot: every caller reads one key in a loop for a few seconds; it goes
  stale every 200 ms and is refreshed while the stale value is served.
  Reported: calls per second, the median and 99th percentile call, rebuilds,
  and the Redis commands the servers ran per call (``INFO commandstats``).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

import stampede
from stampede.testing import RedisCluster, RedisServer, find_valkey_server

from .._common.report import Section, Table, render_section

INSTANCES = 4
THREADS = 16
REBUILD = 0.2


def _commands(ports: Sequence[int]) -> int:
    total = 0
    for port in ports:
        with redis.Redis(port=port, socket_timeout=5) as client:
            stats = client.info("commandstats")
        total += sum(int(value["calls"]) for name, value in stats.items() if name.startswith("cmdstat_"))
    return total


def _in_threads(work: Callable[[int], None]) -> None:
    threads = [threading.Thread(target=work, args=(i,)) for i in range(INSTANCES * THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)


def _cold_trial(instances: Sequence[stampede.Stampede], key: str) -> tuple[int, float]:
    """One cold key asked for by every caller at once: rebuilds, and the slowest wait beyond the rebuild."""
    rebuilds = itertools.count()
    finished: list[float] = []
    barrier = threading.Barrier(INSTANCES * THREADS)

    def rebuild() -> str:
        next(rebuilds)
        time.sleep(REBUILD)
        return "value"

    def call(i: int) -> None:
        barrier.wait()
        started = time.monotonic()
        instances[i % INSTANCES].get_or_rebuild(key, rebuild, ttl=60)
        finished.append(time.monotonic() - started)

    _in_threads(call)
    return next(rebuilds), max(finished) - REBUILD


def cold(instances: Sequence[stampede.Stampede], trials: int) -> tuple[int, float]:
    """Rebuilds per trial (the most seen) and the slowest caller's median wait beyond the rebuild."""
    outcomes = [_cold_trial(instances, f"cold-{trial}") for trial in range(trials)]
    return max(rebuilds for rebuilds, _ in outcomes), statistics.median(slack for _, slack in outcomes)


def hot(instances: Sequence[stampede.Stampede], ports: Sequence[int], seconds: float) -> dict[str, Any]:
    rebuilds = itertools.count()
    latencies: list[list[float]] = [[] for _ in range(INSTANCES * THREADS)]
    stop = threading.Event()

    def rebuild() -> str:
        next(rebuilds)
        time.sleep(0.01)
        return "value"

    instances[0].get_or_rebuild("hot", rebuild, ttl=0.2, stale_ttl=60)
    before = _commands(ports)

    def call(i: int) -> None:
        sf, mine = instances[i % INSTANCES], latencies[i]
        while not stop.is_set():
            started = time.monotonic()
            sf.get_or_rebuild("hot", rebuild, ttl=0.2, stale_ttl=60)
            mine.append(time.monotonic() - started)

    timer = threading.Timer(seconds, stop.set)
    timer.start()
    _in_threads(call)
    commands = _commands(ports) - before - len(ports)  # less the INFO calls themselves
    every = sorted(itertools.chain.from_iterable(latencies))
    return {
        "calls_per_s": len(every) / seconds,
        "p50": every[len(every) // 2],
        "p99": every[int(len(every) * 0.99)],
        "rebuilds": next(rebuilds) - 1,
        "commands_per_call": commands / len(every),
    }


def run(server: str, topology: str, trials: int, seconds: float) -> list[str]:
    binary = find_valkey_server() if server == "valkey" else None
    setup: RedisServer | RedisCluster = (
        RedisCluster(binary=binary) if topology == "cluster" else RedisServer(binary=binary)
    )
    with setup:
        if isinstance(setup, RedisCluster):
            url, ports = setup.url.replace("redis://", "redis+cluster://"), [n.port for n in setup.nodes[:3]]
        else:
            url, ports = setup.url, [setup.port]
        instances = [stampede.Stampede.from_url(url, namespace="bench") for _ in range(INSTANCES)]
        try:
            cold(instances, 1)  # warm-up: connections, scripts loaded
            rebuilds, slack = cold(instances, trials)
            figures = hot(instances, ports, seconds)
        finally:
            for instance in instances:
                instance.close()
    return [
        server,
        "3-master cluster" if topology == "cluster" else "one server",
        str(rebuilds),
        f"{slack * 1000:.1f} ms",
        f"{figures['calls_per_s']:,.0f}",
        f"{figures['p50'] * 1e6:.0f} µs",
        f"{figures['p99'] * 1000:.2f} ms",
        str(figures["rebuilds"]),
        f"{figures['commands_per_call']:.2f}",
    ]


def section(servers: Sequence[str] = ("redis", "valkey"), trials: int = 7, seconds: float = 4.0) -> Section:
    """Both topologies for each of ``servers``: the report's section."""
    rows = [
        run(server, topology, trials, seconds) for server in servers for topology in ("server", "cluster")
    ]
    headers = [
        "server",
        "topology",
        "cold: rebuilds",
        "cold: slowest beyond rebuild",
        "hot: calls/s",
        "hot: p50",
        "hot: p99",
        "hot: rebuilds",
        "hot: commands/call",
    ]
    intro = (
        f"{INSTANCES} instances x {THREADS} threads; cold: one missing key, a {REBUILD * 1000:.0f} ms "
        "rebuild (median of the trials); hot: one key read in a loop, stale every 200 ms"
    )
    return Section("One server and a cluster", intro + ".", Table(headers, rows, "llrrrrrrr"))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench topologies", description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="redis,valkey", help="redis, valkey or both")
    parser.add_argument("--trials", type=int, default=7, help="cold trials per setup")
    parser.add_argument("--seconds", type=float, default=4.0, help="hot phase length per setup")
    args = parser.parse_args(argv)
    print(render_section(section(args.servers.split(","), args.trials, args.seconds)))
