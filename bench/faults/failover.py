"""``python -m bench failover``: what a failover costs callers, stampede against a plain client.

A local Redis Cluster (3 masters, 3 replicas) and a Sentinel setup (1 master,
1 replica, 3 Sentinels). 16 threads read 12 cached keys in a loop; the master
of the first key is killed; the run goes on until a replica has been
promoted and one second more. The same run with redis-py's own client (a
``GET`` per call, as a stock cache backend sends) shows what callers see
without stampede. Counted over the calls on the dead master's keys between
the kill and the promotion: errors, values served, the slowest call.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import redis
import redis.cluster
import redis.sentinel

import stampede
from stampede._core.keys import KeySpace
from stampede.testing import RedisCluster, RedisSentinel, RedisServer, find_valkey_server

from .._common.report import Section, Table, render_section

THREADS = 16
KEYS = [f"key-{i}" for i in range(12)]
NAMESPACE = "failover"


@dataclass
class Calls:
    """What the callers saw: per call on a key of the dead master, during the failover."""

    ok: int = 0
    errors: int = 0
    slowest: float = 0.0
    rebuilds: int = 0
    replica_hits: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, ok: bool, seconds: float) -> None:
        with self.lock:
            if ok:
                self.ok += 1
            else:
                self.errors += 1
            self.slowest = max(self.slowest, seconds)


def _setup(kind: str, binary: str | None) -> RedisCluster | RedisSentinel:
    return RedisCluster(binary=binary) if kind == "cluster" else RedisSentinel(binary=binary)


def _master_of(setup: RedisCluster | RedisSentinel, name: bytes) -> RedisServer:
    return setup.master_of(name) if isinstance(setup, RedisCluster) else setup.current_master()


def _url(setup: RedisCluster | RedisSentinel) -> str:
    return setup.url.replace("redis://", "redis+cluster://") if isinstance(setup, RedisCluster) else setup.url


def run(kind: str, server: str, client: str) -> tuple[Calls, float]:
    """One failover; the calls on the dead master's keys during it, and how long it took."""
    binary = find_valkey_server() if server == "valkey" else None
    with _setup(kind, binary) as setup:
        names = {key: KeySpace(NAMESPACE)(key).value for key in KEYS}
        calls = Calls()
        window = threading.Event()
        if client == "stampede":

            def count(event: stampede.Event) -> None:
                if event.kind is stampede.EventKind.REPLICA_HIT and window.is_set():
                    with calls.lock:
                        calls.replica_hits += 1

            cache = stampede.Stampede.from_url(
                _url(setup), namespace=NAMESPACE, ttl=60, wait_timeout=30, on_event=count
            )

            def rebuild() -> str:
                with calls.lock:
                    calls.rebuilds += 1
                return "value"

            def call(key: str) -> object:
                return cache.get_or_rebuild(key, rebuild)

            for key in KEYS:
                call(key)
            close: Callable[[], None] = cache.close
        else:
            plain = stampede.redis_client(_url(setup), socket_timeout=5, socket_connect_timeout=5)
            for name in names.values():
                plain.set(name, b"value")

            def call(key: str) -> object:
                return plain.get(names[key])

            close = plain.close
        victim = _master_of(setup, names[KEYS[0]])
        dead = {key for key, name in names.items() if _master_of(setup, name) is victim}
        stop = threading.Event()

        def caller() -> None:
            while not stop.is_set():
                for key in KEYS:
                    started = time.monotonic()
                    try:
                        call(key)
                        ok = True
                    except Exception:
                        ok = False
                    if key in dead and window.is_set():
                        calls.record(ok, time.monotonic() - started)

        threads = [threading.Thread(target=caller, daemon=True) for _ in range(THREADS)]
        for thread in threads:
            thread.start()
        while not setup.in_sync():
            time.sleep(0.01)
        time.sleep(0.5)
        window.set()
        killed = time.monotonic()
        victim.stop()
        while True:
            try:
                if _master_of(setup, names[KEYS[0]]) is not victim:
                    break
            except (redis.RedisError, RuntimeError):
                pass
            time.sleep(0.01)
        took = time.monotonic() - killed
        time.sleep(0.2)  # calls under way at the promotion end
        window.clear()
        time.sleep(1.0)
        stop.set()
        for thread in threads:
            thread.join(30)
        close()
        calls.rebuilds -= len(KEYS) if client == "stampede" else 0
        return calls, took


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench failover", description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default="redis,valkey", help="redis, valkey or both")
    args = parser.parse_args(argv)
    rows = []
    for kind in ("cluster", "sentinel"):
        for server in args.servers.split(","):
            for client in ("redis-py GET", "stampede"):
                calls, took = run(kind, server, "stampede" if client == "stampede" else "plain")
                total = calls.ok + calls.errors
                rows.append(
                    [
                        f"{kind} ({server})",
                        client,
                        f"{took:.1f} s",
                        str(total),
                        f"{100 * calls.errors / total:.0f}%" if total else "-",
                        f"{calls.slowest * 1000:.0f} ms",
                        str(calls.replica_hits) if client == "stampede" else "-",
                        str(calls.rebuilds) if client == "stampede" else "-",
                    ]
                )
    headers = [
        "setup",
        "client",
        "failover",
        "calls",
        "errors",
        "slowest call",
        "replica copies served",
        "extra rebuilds",
    ]
    intro = (
        f"{THREADS} threads read {len(KEYS)} cached keys in a loop; the master of the first is "
        "killed. Counted: the calls on that master's keys from the kill to the promotion"
    )
    table = Table(headers, rows, align="llrrrrrr")
    print(render_section(Section("Failover", intro + ".", table)))
