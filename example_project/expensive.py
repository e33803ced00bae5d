"""The expensive part of every example page: a deliberately slow report.

Each run is counted in Redis (a list per key prefix), so the demo can tell
how many times the expensive code ran across every server process.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import redis

from .settings import ExampleConfig

__all__ = ["Report", "build_report", "runs_key"]

_clients: dict[str, redis.Redis] = {}


@dataclass(frozen=True)
class Report:
    """What the slow query returns: a few rows, and when it finished."""

    title: str
    rows: list[tuple[str, int]]
    finished_at: float

    @property
    def stamp(self) -> str:
        """``finished_at`` as the pages print it, for the demo to read back."""
        return f"{self.finished_at:.6f}"


def runs_key(key_prefix: str) -> str:
    """The Redis list recording every run, as ``"<app>:<page> <unix time it began>"``."""
    return f"{key_prefix}:expensive-runs"


def _counter(url: str) -> redis.Redis:
    # One client per process and URL: counting must not cost a connection per run.
    client = _clients.get(url)
    if client is None:
        client = _clients[url] = redis.Redis.from_url(url, socket_timeout=5)
    return client


def build_report(settings: ExampleConfig, app: str, page: str) -> Report:
    """Run the slow "query" for ``app``'s ``page`` and record that it ran."""
    started = time.time()
    time.sleep(settings.rebuild_seconds)  # stands in for a slow SQL query or an API call
    rng = random.Random()
    regions = ("north", "south", "east", "west", "online")
    rows = [(region, rng.randrange(1_000, 100_000)) for region in regions]
    finished = time.time()
    _counter(settings.redis_url).rpush(runs_key(settings.key_prefix), f"{app}:{page} {started:.6f}")
    return Report(title=f"Sales by region ({app}, {page})", rows=rows, finished_at=finished)
