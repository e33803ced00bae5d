"""``python -m bench eviction``: what a Redis that evicts (``maxmemory``) does to leases and rebuilds,
and whether any read travels back in time.

A keyspace larger than Redis's memory, read by 16 threads (4 instances, as
4 processes would be, of 4 threads each) with a skewed popularity, under
each eviction policy. Redis reports every key it evicts (keyspace
notifications, ``evicted``): values and leases are counted apart.
Every value evicted costs one rebuild, which no cache can avoid; what this
measures is what eviction costs beyond that: leases evicted under their
holders, commits refused, rebuilds of one key running at once.

Then, under every policy, ``bench.faults._evicting``: instances read, rebuild,
write and invalidate while a filler makes Redis evict, every read checked
against the versions of a database (values served as fresh after an
invalidation, deletion or replacement, values served at all after a
deletion), and the same without writes, counting rebuilds of one key at once
and within one ``ttl`` (all of them, and those with nothing the key's value
needs evicted between them: its value, its tag's or the namespace's state).
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import redis

import stampede
from stampede.testing import RedisServer

from .._common.report import Section, Table, render_section
from . import _evicting

POLICIES = ("allkeys-lru", "allkeys-lfu", "volatile-lru", "volatile-ttl")
INSTANCES = 4
THREADS = 4


@dataclass(frozen=True)
class Workload:
    """``hot_share`` of the calls go to the first ``hot`` of ``keys`` keys, the rest anywhere."""

    name: str
    keys: int
    hot: int
    hot_share: float
    value_bytes: int
    maxmemory: str
    ttl: float
    rebuild_seconds: float

    def describe(self) -> str:
        return (
            f"{self.keys} keys of {self.value_bytes} bytes in a Redis of `maxmemory {self.maxmemory}`, "
            f"{self.hot_share:.0%} of calls to {self.hot} of them; values live {self.ttl:g} s, "
            f"rebuilds take {self.rebuild_seconds * 1000:.0f} ms"
        )


WORKLOADS = {
    # A long tail of idle values: what LRU evicts first is the tail.
    "tail": Workload("tail", 3000, 200, 0.8, 2000, "4mb", 600, 0.02),
    # Only hot keys, expiring often, slow rebuilds: leases are the idlest keys there are.
    "hot": Workload("hot", 300, 300, 1.0, 8000, "2mb", 1.0, 0.2),
}


@dataclass
class Outcome:
    workload: str
    policy: str
    calls: int
    rebuilds: int
    keys: int
    evicted: Counter[str]
    rejected: int
    lost: int
    most_at_once: int


class Rebuilds:
    """Counts rebuilds, and the most of one key running at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: Counter[str] = Counter()
        self.count = 0
        self.keys: set[str] = set()
        self.most_at_once = 0

    def __call__(self, key: str, size: int, seconds: float) -> bytes:
        with self._lock:
            self.count += 1
            self.keys.add(key)
            self._running[key] += 1
            self.most_at_once = max(self.most_at_once, self._running[key])
        try:
            time.sleep(seconds)
            return random.randbytes(size)  # incompressible: it takes its size in Redis
        finally:
            with self._lock:
                self._running[key] -= 1


def _evictions(url: str, counts: Counter[str], stop: threading.Event) -> None:
    client = redis.Redis.from_url(url)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe("__keyevent@0__:evicted")
    try:
        while not stop.is_set():
            message = pubsub.get_message(timeout=0.1)
            if message is None:
                continue
            name = bytes(message["data"])
            kind = "lease" if name.endswith(b":lease") else "state" if name.endswith(b"}:tag") else "value"
            counts[kind] += 1
    finally:
        pubsub.close()
        client.close()


def run_policy(work: Workload, policy: str, seconds: float) -> Outcome:
    args = ["--maxmemory", work.maxmemory, "--maxmemory-policy", policy, "--notify-keyspace-events", "Ee"]
    with RedisServer(args=args) as server:
        evicted: Counter[str] = Counter()
        events: Counter[str] = Counter()
        stop = threading.Event()
        watcher = threading.Thread(target=_evictions, args=(server.url, evicted, stop), daemon=True)
        watcher.start()
        rebuilds = Rebuilds()
        calls = Counter[int]()

        def told(event: stampede.Event) -> None:
            events[event.kind.value] += 1

        instances = [
            stampede.Stampede(
                redis.Redis.from_url(server.url, socket_timeout=5),
                namespace="evict",
                ttl=work.ttl,
                lease_ttl=2,
                on_event=told,
            )
            for _ in range(INSTANCES)
        ]

        def caller(sf: stampede.Stampede, seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                hot = rng.random() < work.hot_share
                key = f"k{rng.randrange(work.hot) if hot else rng.randrange(work.keys)}"
                try:
                    sf.get_or_rebuild(
                        key,
                        lambda key=key: rebuilds(key, work.value_bytes, work.rebuild_seconds),  # type: ignore[misc]
                    )
                except stampede.StampedeError:
                    events["error"] += 1
                calls[seed] += 1

        threads = [
            threading.Thread(target=caller, args=(sf, i * THREADS + t), daemon=True)
            for i, sf in enumerate(instances)
            for t in range(THREADS)
        ]
        for thread in threads:
            thread.start()
        time.sleep(seconds)
        stop.set()
        for thread in threads:
            thread.join(10)
        watcher.join(5)
        for sf in instances:
            sf.close()
            sf.client.close()
        return Outcome(
            work.name,
            policy,
            sum(calls.values()),
            rebuilds.count,
            len(rebuilds.keys),
            evicted,
            events["commit_rejected"],
            events["lease_lost"],
            rebuilds.most_at_once,
        )


def section(outcomes: Sequence[Outcome]) -> Section:
    rows = []
    for o in outcomes:
        values = o.evicted["value"]
        rows.append(
            [
                o.workload,
                o.policy,
                str(o.calls),
                str(o.rebuilds),
                str(values),
                str(o.evicted["lease"]),
                str(o.rejected),
                f"{o.rebuilds / (o.keys + values):.2f}" if o.keys + values else "n/a",
                str(o.most_at_once),
            ]
        )
    table = Table(
        [
            "workload",
            "policy",
            "calls",
            "rebuilds",
            "values evicted",
            "leases evicted",
            "commits refused",
            "rebuilds per (key + value evicted)",
            "most rebuilds of a key at once",
        ],
        rows,
        "llrrrrrrr",
    )
    workloads = sorted({o.workload for o in outcomes})
    intro = f"{INSTANCES} instances x {THREADS} threads. " + "; ".join(
        f"`{name}`: {WORKLOADS[name].describe()}" for name in workloads
    )
    return Section("Eviction", intro + ".", table)


def checked_section(seconds: float, policies: Sequence[str]) -> Section:
    """Every policy under ``_evicting``'s load: with writes (what reads served), and without
    (how many rebuilds of a key)."""
    rows = []
    for policy in policies:
        written = _evicting.run(_evicting.Scenario(seconds=seconds), policy)
        reads_only = _evicting.run(_evicting.Scenario(seconds=seconds, writers=0), policy)
        evicted = written.evicted
        errors = sum(n for kind, n in written.errors.items() if ":" not in kind)
        rows.append(
            [
                policy,
                str(written.reads),
                str(sum(written.writes.values())),
                " / ".join(str(evicted[kind]) for kind in ("value", "lease", "tag state", "namespace state")),
                str(sum(written.fresh_too_old.values())),
                str(sum(written.deleted_served.values())),
                str(errors),
                str(reads_only.rebuilds),
                str(reads_only.most_at_once),
                str(reads_only.most_in_a_window),
                str(reads_only.most_in_a_kept_window),
            ]
        )
    table = Table(
        [
            "policy",
            "reads",
            "writes",
            "evicted: values / leases / tag states / namespace state",
            "served as fresh after an invalidation",
            "served after a deletion",
            "read errors",
            "reads only: rebuilds",
            "most of a key at once",
            "most of a key within one ttl",
            "... with nothing it needs evicted between them",
        ],
        rows,
        "lrrlrrrrrrr",
    )
    s = _evicting.Scenario(seconds=seconds)
    intro = (
        f"`bench.faults._evicting`, {seconds:g} s per policy and case: {s.instances} blocking instances x "
        f"{s.readers} threads and an asyncio instance of {s.async_readers} tasks (get, get_or_rebuild, "
        f"get_or_rebuild_many, read and commit), {s.keys} keys in {s.tags} tags, ttl {s.ttl:g} s, "
        f"stale {s.stale_ttl:g} s, "
        f"rebuilds {s.rebuild_seconds * 1000:g} ms, values {s.value_bytes} bytes, `maxmemory {s.maxmemory}`, "
        f"a filler writing {s.filler_rate:g} keys of {s.filler_bytes} bytes a second; with writes: "
        f"{s.writers} writers, one write each {s.write_every * 1000:g} ms."
    )
    return Section("Eviction: what reads served", intro, table)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench eviction", description=__doc__)
    parser.add_argument("--seconds", type=float, default=8.0, help="how long each policy runs")
    parser.add_argument("--policy", action="append", choices=POLICIES, help="only these (repeatable)")
    parser.add_argument("--workload", action="append", choices=sorted(WORKLOADS), help="only these")
    parser.add_argument(
        "--checked-seconds", type=float, default=10.0, help="how long each checked run lasts (0: none)"
    )
    args = parser.parse_args(argv)
    outcomes = [
        run_policy(WORKLOADS[name], policy, args.seconds)
        for name in args.workload or sorted(WORKLOADS)
        for policy in args.policy or POLICIES
    ]
    print(render_section(section(outcomes)))
    if args.checked_seconds > 0:
        print(render_section(checked_section(args.checked_seconds, args.policy or _evicting.POLICIES)))
