"""Several processes and faults: killed or paused lease holders, Redis going away."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections import Counter
from typing import Any

import pytest
import redis

import stampede
from stampede import RedisUnavailableError
from stampede._core.keys import KeySpace
from stampede.testing import RedisServer
from tests import workers
from tests.helpers import Rebuilds, lease_held, run_threads, wait_until

pytestmark = pytest.mark.slow

ctx = multiprocessing.get_context("spawn")
PROCESSES, THREADS = 4, 8


def run_everywhere(url: str, namespace: str, key: str, options: dict[str, Any], value: Any) -> list[Any]:
    """PROCESSES x THREADS callers of ``key``, released together; every result."""
    barrier = ctx.Barrier(PROCESSES)
    queue = ctx.Queue()
    procs = [
        ctx.Process(
            target=workers.run_callers,
            args=(queue, url, namespace, key, THREADS, barrier, options, value, 0.3),
        )
        for _ in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    results = [item for _ in procs for item in queue.get(timeout=120)]
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    return results


def test_cold_key_across_processes_one_rebuild(redis_url: str, client: redis.Redis, namespace: str) -> None:
    results = run_everywhere(redis_url, namespace, "cold", {"ttl": 60}, "built")
    assert results == ["built"] * (PROCESSES * THREADS)
    assert client.get(f"{namespace}:rebuilds") == b"1"


def test_stale_key_across_processes_one_refresh_rest_served_stale(
    redis_url: str, client: redis.Redis, namespace: str
) -> None:
    sf = stampede.Stampede(client, namespace=namespace)
    sf.set("hot", "stale", ttl=60, stale_ttl=600)
    sf.invalidate("hot")
    results = run_everywhere(redis_url, namespace, "hot", {"ttl": 60, "stale_ttl": 600}, "fresh")
    assert Counter(results) == {"stale": PROCESSES * THREADS - 1, "fresh": 1}
    assert client.get(f"{namespace}:rebuilds") == b"1"
    assert sf.get("hot").value == "fresh"


def start_holder(url: str, namespace: str, lease_ttl: float, delay: float) -> tuple[Any, Any]:
    queue = ctx.Queue()
    proc = ctx.Process(target=workers.hold_lease, args=(url, namespace, "k", lease_ttl, delay, queue))
    proc.start()
    with redis.Redis.from_url(url) as probe:
        wait_until(lambda: probe.exists(f"{namespace}:started") == 1, timeout=30)
    return proc, queue


def test_holder_killed_mid_rebuild_another_caller_takes_over(
    redis_url: str, client: redis.Redis, namespace: str
) -> None:
    proc, _ = start_holder(redis_url, namespace, lease_ttl=1.0, delay=60)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    # A bound that the lease TTL fits in: raising would mean someone waited past it.
    sf = stampede.Stampede(client, namespace=namespace, on_wait_timeout="raise", wait_timeout=15)
    rebuild = Rebuilds(lambda n: "taken over", delay=0.1)
    results = run_threads(8, lambda: sf.get_or_rebuild("k", rebuild, ttl=60))
    assert results == ["taken over"] * 8
    assert rebuild.count == 1


def test_holder_paused_past_its_lease_cannot_overwrite_the_newer_value(
    redis_url: str, client: redis.Redis, namespace: str
) -> None:
    proc, queue = start_holder(redis_url, namespace, lease_ttl=0.5, delay=1.0)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        lease = KeySpace(namespace)("k").lease
        wait_until(lambda: not lease_held(client, lease))  # the frozen watchdog stopped renewing
        sf = stampede.Stampede(client, namespace=namespace, on_wait_timeout="raise")
        assert sf.get_or_rebuild("k", lambda: "newer", ttl=60) == "newer"
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    result, events = queue.get(timeout=30)
    proc.join(10)
    # Its caller is served what the newer write left, not what Redis refused:
    # handed that, it would next be served the older stored value.
    assert result == "newer"
    assert "lease_lost" in events
    assert "commit_rejected" in events
    assert sf.get("k").value == "newer"  # the newer value stays


def load(sf: stampede.Stampede, stop: threading.Event, outcomes: Counter[str]) -> None:
    while not stop.is_set():
        try:
            sf.get_or_rebuild("k", lambda: "value", ttl=0.05)
            outcomes["ok"] += 1
        except RedisUnavailableError:
            outcomes["unavailable"] += 1


def under_load(strict: stampede.Stampede, lenient: stampede.Stampede) -> tuple[Counter[str], Counter[str]]:
    """Three callers per instance until each instance has seen a few outcomes."""
    stop = threading.Event()
    strict_outcomes: Counter[str] = Counter()
    lenient_outcomes: Counter[str] = Counter()
    threads = [
        threading.Thread(target=load, args=(sf, stop, counts))
        for sf, counts in [(strict, strict_outcomes)] * 3 + [(lenient, lenient_outcomes)] * 3
    ]
    for thread in threads:
        thread.start()
    wait_until(lambda: sum(strict_outcomes.values()) >= 3 and sum(lenient_outcomes.values()) >= 3, timeout=60)
    stop.set()
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive(), "a caller hung"
    return strict_outcomes, lenient_outcomes


@pytest.mark.parametrize("fault", ["stopped", "paused"])
def test_redis_going_away_under_load_errors_or_fails_open_then_recovers(
    server: RedisServer, fault: str
) -> None:
    def instance(**options: Any) -> stampede.Stampede:
        return stampede.Stampede.from_url(
            server.url, socket_timeout=0.5, socket_connect_timeout=0.5, **options
        )

    strict, lenient = instance(), instance(fail_open=True)
    up_strict, up_lenient = under_load(strict, lenient)
    server.pause() if fault == "paused" else server.stop()
    down_strict, down_lenient = under_load(strict, lenient)
    server.resume() if fault == "paused" else server.start()
    # Until the breaker's next probe (at most its longest pause) calls skip
    # Redis; from the probe that succeeds on, every call goes again.
    wait_until(lambda: _answers(strict), timeout=10)
    back_strict, back_lenient = under_load(strict, lenient)
    strict.close()
    lenient.close()
    assert up_strict["unavailable"] == up_lenient["unavailable"] == 0
    assert down_strict["ok"] == 0
    assert down_strict["unavailable"] > 0
    assert down_lenient["unavailable"] == 0
    assert down_lenient["ok"] > 0
    assert back_strict["ok"] > 0
    assert back_strict["unavailable"] == 0
    assert back_lenient["ok"] > 0


def _answers(sf: stampede.Stampede) -> bool:
    try:
        sf.get_or_rebuild("k", lambda: "value", ttl=0.05)
    except RedisUnavailableError:
        return False
    return True
