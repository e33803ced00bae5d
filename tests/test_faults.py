"""Faults injected for real: lost replies, frozen and cut connections, Redis
paused, restarted and its scripts flushed, clients killed, workers killed
and paused, all at random under load, and what must hold throughout.

Three worker processes (threads with ``get_or_rebuild``, asyncio tasks with
``get_or_rebuild``, threads with ``read`` then ``commit``) call a few keys in a
loop through :class:`~support.proxies.FaultyProxy`. A writer in this process
bumps a key's version in the "database" (a second Redis, never harmed) and
then deletes or invalidates the key, as an application's save would. Then:

- no newer write is ever overwritten: once a delete of version v has
  returned, the cache never holds an older version of that key;
- no caller is served a version older than one it already had;
- at most 2 rebuilds of a key run at once (a paused holder and the one that
  took over), not counting the rebuilds ``read()`` hands back without a lease
  (after ``wait_timeout``: nothing to commit), which are logged apart and
  happen only while faults are applied;
- every call ends within a bound (``wait_timeout``, the lease, socket
  time-outs and a worker's pause), and once the faults stop (and each
  process's circuit breaker has had its next probe), every call succeeds
  again.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import stampede
from stampede._core import breaker
from stampede.testing import RedisServer
from support.proxies import FaultyProxy
from tests import soak_worker

pytestmark = pytest.mark.slow

SOAK_SECONDS = float(os.environ.get("STAMPEDE_SOAK_SECONDS", "40"))
CALM_SECONDS = 4.0
#: After the faults stop, until every call must succeed: a second, and the
#: longest a process's circuit breaker may still skip Redis (its longest
#: pause and jitter, counted from its last failed probe).
SETTLING = 1.0 + breaker.LONGEST_PAUSE * (1 + breaker.JITTER)
MODES = ("sync", "asyncio", "split")
#: A call's bound: wait_timeout, a lease's lapse, the commit's retries within
#: the lease, socket time-outs of each round trip and retry, a worker paused.
CALL_BOUND = 15.0


class Workers:
    """The soak's worker processes: started, killed, paused and restarted."""

    def __init__(self, cache_url: str, db_url: str, out: Path) -> None:
        self._args = (cache_url, db_url, str(out))
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.paused: set[str] = set()

    def start(self, mode: str) -> None:
        self.processes[mode] = subprocess.Popen(
            [sys.executable, "-m", "tests.soak_worker", mode, *self._args],
            cwd=Path(__file__).resolve().parent.parent,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def kill(self, mode: str) -> None:
        process = self.processes[mode]
        process.kill()
        process.wait(10)
        self.paused.discard(mode)
        self.start(mode)

    def pause(self, mode: str, seconds: float) -> None:
        process = self.processes[mode]
        process.send_signal(signal.SIGSTOP)
        self.paused.add(mode)
        time.sleep(seconds)
        process.send_signal(signal.SIGCONT)
        self.paused.discard(mode)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
            process.wait(10)


@pytest.fixture
def soak(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer, FaultyProxy, Workers]]:
    with RedisServer() as cache, RedisServer() as db, FaultyProxy(cache.port) as proxy:
        workers = Workers(proxy.url, db.url, tmp_path)
        try:
            for mode in MODES:
                workers.start(mode)
            yield cache, db, proxy, workers
        finally:
            workers.stop()


def faults(
    cache: RedisServer, proxy: FaultyProxy, workers: Workers, admin: Callable[[], redis.Redis]
) -> dict[str, Callable[[random.Random], None]]:
    """Each fault, applied and then healed; a worker or Redis is left running."""

    def for_a_while(start: Callable[[], None], stop: Callable[[], None]) -> Callable[[random.Random], None]:
        def fault(rng: random.Random) -> None:
            start()
            time.sleep(rng.uniform(0.2, 1.5))
            stop()

        return fault

    def quietly(command: Callable[[redis.Redis], Any]) -> Callable[[random.Random], None]:
        def fault(_: random.Random) -> None:
            try:
                command(admin())
            except redis.RedisError:
                pass

        return fault

    return {
        "replies lost": for_a_while(proxy.lose_replies, proxy.heal),
        "connections frozen": for_a_while(proxy.freeze, proxy.thaw),
        "connections cut": lambda _: proxy.cut(),
        "redis paused": for_a_while(cache.pause, cache.resume),
        "redis restarted": lambda _: (cache.stop(), cache.start()),
        "scripts flushed": quietly(lambda client: client.script_flush()),
        "clients killed": quietly(lambda client: client.client_kill_filter(_type="normal", skipme=True)),
        "subscribers killed": quietly(lambda client: client.client_kill_filter(_type="pubsub")),
        "worker killed": lambda rng: workers.kill(rng.choice(MODES)),
        "worker paused": lambda rng: workers.pause(rng.choice(MODES), rng.uniform(0.2, 1.5)),
    }


def records(out: Path) -> list[dict[str, Any]]:
    found = []
    for path in out.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            if line.endswith("}"):
                found.append(json.loads(line))
    return found


@pytest.mark.soak
def test_a_soak_of_random_faults_keeps_every_promise(
    soak: tuple[RedisServer, RedisServer, FaultyProxy, Workers], tmp_path: Path
) -> None:
    cache, db_server, proxy, workers = soak
    db = redis.Redis.from_url(db_server.url, socket_timeout=10)
    # The writer goes through the proxy, as the workers do; the check reads
    # Redis directly (and skips a read that the faults make fail).
    writer = stampede.Stampede(
        redis.Redis.from_url(proxy.url, **soak_worker.SOCKET), namespace="soak", **soak_worker.OPTIONS
    )
    checker = stampede.Stampede(redis.Redis.from_url(cache.url, **soak_worker.SOCKET), namespace="soak")
    floors = dict.fromkeys(soak_worker.KEYS, 0)
    overwritten: list[str] = []
    writes = {"deleted": 0, "invalidated": 0, "failed": 0}
    stop = threading.Event()

    def write() -> None:
        rng = random.Random(7)
        while not stop.is_set():
            key = rng.choice(soak_worker.KEYS)
            version = int(db.incr(f"version:{key}"))
            try:
                if rng.random() < 0.7:
                    writer.delete(key)
                    floors[key] = version  # from now on, nothing older may be stored
                    writes["deleted"] += 1
                else:
                    writer.invalidate(key)
                    writes["invalidated"] += 1
            except stampede.StampedeError:
                writes["failed"] += 1
            for name in soak_worker.KEYS:
                floor = floors[name]
                try:
                    entry = checker.get(name)
                except stampede.StampedeError:
                    continue
                if entry is not None and entry.value[0] < floor:
                    overwritten.append(f"{name}: holds version {entry.value[0]} after a delete of {floor}")
            time.sleep(rng.uniform(0.03, 0.15))

    writing = threading.Thread(target=write, daemon=True)
    writing.start()
    applied: dict[str, int] = {}
    faults_log = soak_worker.Log(tmp_path / "faults.jsonl")
    rng = random.Random(int(os.environ.get("STAMPEDE_SOAK_SEED", "11")))
    menu = faults(cache, proxy, workers, lambda: redis.Redis.from_url(cache.url, socket_timeout=2))
    try:
        end = time.monotonic() + SOAK_SECONDS
        rounds: list[str] = []
        while time.monotonic() < end:
            if not rounds:  # every fault once per round, in a random order
                rounds = rng.sample(sorted(menu), len(menu))
            name = rounds.pop()
            faults_log.write(kind="fault", fault=name)
            menu[name](rng)
            faults_log.write(kind="fault", fault="healed")
            applied[name] = applied.get(name, 0) + 1
            time.sleep(rng.uniform(0.3, 1.0))
        proxy.heal()
        calm_from = time.time() + SETTLING
        time.sleep(CALM_SECONDS)
    finally:
        stop.set()
        writing.join(10)
        writer.close()
        checker.close()
        writer.client.close()
        checker.client.close()
    seen = records(tmp_path)
    calls = [r for r in seen if r["kind"] == "call"]
    errors = [r for r in seen if r["kind"] == "error"]
    violations = [r for r in seen if r["kind"] == "violation"]
    unleased = [r for r in seen if r["kind"] == "unleased rebuild"]
    most_at_once = max(int(db.get(f"most:{key}") or 0) for key in soak_worker.KEYS)
    slowest = max(r["took"] for r in calls + errors)
    summary = (
        f"faults {applied}; writes {writes}; {len(calls)} calls, {len(errors)} errors, "
        f"slowest {slowest:.2f} s, at most {most_at_once} rebuilds of a key at once, "
        f"{len(unleased)} read()s told to rebuild without a lease; "
        f"every call and event is in {tmp_path}"
    )
    print(summary)
    assert not overwritten, (overwritten[:5], summary)
    assert not violations, (violations[:5], summary)
    assert most_at_once <= 2, summary
    assert slowest < CALL_BOUND, summary
    # Every fault was exercised, and calls went on.
    assert len(applied) == len(menu), summary
    assert writes["deleted"] > 20, summary
    # Once the faults stopped, every call of every worker succeeded.
    late_errors = [r for r in errors if r["at"] - r["took"] > calm_from]
    assert not late_errors, (late_errors[:5], summary)
    late_unleased = [r for r in unleased if r["at"] - r["took"] > calm_from]
    assert not late_unleased, (late_unleased[:5], summary)
    late_calls = {r["key"] for r in calls if r["at"] > calm_from}
    assert late_calls == set(soak_worker.KEYS), summary
    db.close()
