"""Groups: what a tagged hit costs beside an untagged one, and how soon another
process sees ``invalidate_tags``.

``python -m bench groups [--rounds 5]`` starts its own redis-server. Hit cost:
CPU time per ``get_or_rebuild`` hit of a small dict in the calling process
(the round trip's wait is the server's), untagged and with two tags,
interleaved, medians over the rounds, without and with a near cache. Seen
after: a reader instance (its own tag states, as another process has) polls
the key while a writer invalidates its tag; the time from the writer's
``invalidate_tags`` returning to the reader's first stale read.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis

import stampede
from stampede.testing import RedisServer

__all__ = ["main"]

CALLS = 5000
VALUE = {"id": 42, "name": "user", "tags": ["a", "b"]}


def _rebuild() -> Any:
    return VALUE


def hit_cost(sf: stampede.Stampede, key: str, tags: tuple[str, ...]) -> float:
    """Best of three blocks of CPU microseconds per hit."""
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        for _ in range(CALLS):
            sf.get_or_rebuild(key, _rebuild, ttl=3600, tags=tags)
        best = min(best, (time.process_time() - started) / CALLS * 1e6)
    return best


def seen_after(url: str, near: bool, rounds: int) -> list[float]:
    """Milliseconds from ``invalidate_tags`` returning to another instance's first stale read."""
    writer = stampede.Stampede(redis.Redis.from_url(url), namespace="groups-seen")
    reader = stampede.Stampede(
        redis.Redis.from_url(url), namespace="groups-seen", near_cache=1000 if near else None
    )
    delays = []
    try:
        for i in range(rounds):
            key = f"k{i}"
            writer.set(key, "old", ttl=3600, stale_ttl=3600, tags=["t"])
            for _ in range(200):  # warm: the reader holds the tag's state (and, near, a copy)
                reader.get_or_rebuild(key, _rebuild, tags=("t",))
            time.sleep(0.15)
            stale_at: list[float] = []
            stop = threading.Event()

            def poll(key: str = key, stale_at: list[float] = stale_at, stop: threading.Event = stop) -> None:
                # The reader's first call to find the value stale refreshes it.
                while not stop.is_set():
                    if reader.get_or_rebuild(key, lambda: "new", tags=("t",)) == "new":
                        stale_at.append(time.perf_counter())
                        return

            poller = threading.Thread(target=poll)
            poller.start()
            time.sleep(0.02)
            writer.invalidate_tags("t")
            done = time.perf_counter()
            poller.join(5)
            stop.set()
            if stale_at:
                delays.append(max(0.0, (stale_at[0] - done) * 1000))
    finally:
        writer.close()
        reader.close()
    return delays


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench groups", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        rows = []
        for near in (False, True):
            sf = stampede.Stampede(client, namespace=f"groups-hit-{near}", near_cache=1000 if near else None)
            sf.set("plain", VALUE, ttl=3600)
            sf.set("tagged", VALUE, ttl=3600, tags=["post:1", "user:7"])
            time.sleep(0.3)
            plain, tagged = [], []
            for _ in range(args.rounds):
                plain.append(hit_cost(sf, "plain", ()))
                tagged.append(hit_cost(sf, "tagged", ("post:1", "user:7")))
            sf.close()
            p, t = statistics.median(plain), statistics.median(tagged)
            rows.append((near, p, t))
        print("hit cost, CPU us per get_or_rebuild hit (median of rounds)")
        print("| near cache | untagged | two tags | tagged/untagged |")
        print("|---|---:|---:|---:|")
        for near, p, t in rows:
            print(f"| {'yes' if near else 'no'} | {p:.2f} | {t:.2f} | {t / p:.2f} |")
        print()
        print("invalidate_tags seen by another instance after (ms)")
        print("| near cache | median | max | rounds |")
        print("|---|---:|---:|---:|")
        for near in (False, True):
            delays = seen_after(server.url, near, max(args.rounds * 4, 10))
            median, worst = statistics.median(delays), max(delays)
            print(f"| {'yes' if near else 'no'} | {median:.1f} | {worst:.1f} | {len(delays)} |")
