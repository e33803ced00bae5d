"""What the Redis under the demo sees while a run goes on: commands per second
and connections, sampled by a thread of the driver on a connection of its own.

``INFO stats`` gives ``total_commands_processed``, a counter of every command the
server ran (a command a Lua script runs counts too): the difference between two
samples is what was sent in between. The sampler's own commands (its ``INFO``s,
and the ``LLEN`` that feeds the progress bar) are subtracted, as they are known
exactly. ``INFO clients`` gives ``connected_clients``; the connections open just
before the app servers started (the driver's own, this sampler's, anyone
else's on a shared Redis) are taken as the baseline and subtracted, which leaves
the app servers' connections.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import redis

__all__ = ["SAMPLE_SECONDS", "RedisSample", "RedisSampler", "sampled"]

#: How often the sampler reads the counters.
SAMPLE_SECONDS = 0.25


@dataclass(frozen=True)
class RedisSample:
    """One sample: ``at`` seconds since the run started (wall clock, as requests are
    timed), the ``commands`` the server ran in the ``interval`` seconds before it
    (the sampler's own not counted), and its ``clients`` (connected_clients less the
    baseline: the app servers' connections, when nothing else connects meanwhile)."""

    at: float
    interval: float
    commands: int
    clients: int

    @property
    def commands_per_second(self) -> float:
        return self.commands / self.interval if self.interval > 0 else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {
            "at": round(self.at, 6),
            "interval": round(self.interval, 6),
            "commands": self.commands,
            "commands_per_second": round(self.commands_per_second, 1),
            "clients": self.clients,
        }


@dataclass
class RedisSampler:
    """Samples the Redis at ``url`` every ``every`` seconds between :meth:`start`
    and :meth:`stop`; also reads the length of ``progress_key`` (runs of the
    expensive code so far) so that the progress bar needs no command of its own."""

    url: str
    progress_key: str
    every: float = SAMPLE_SECONDS
    #: connected_clients before the app servers started; see :meth:`baseline`.
    baseline_clients: int = 0
    #: The latest length of ``progress_key``.
    expensive_runs: int = 0
    #: (wall-clock time, seconds since the previous sample, commands, clients)
    _samples: list[tuple[float, float, int, int]] = field(default_factory=list)
    _last: tuple[float, int] | None = None
    _error: redis.RedisError | None = None
    _client: redis.Redis | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    #: Commands per sample: INFO stats, INFO clients, LLEN.
    OWN_COMMANDS = 3

    def connect(self) -> None:
        """Open the sampler's connection and read the baseline of connected clients.

        Call it before the app servers start: the connections counted then are not theirs.
        """
        self._client = redis.Redis.from_url(self.url, socket_timeout=5, socket_connect_timeout=5)
        self.baseline_clients = int(self._client.info("clients")["connected_clients"])

    def start(self) -> None:
        """Take the first sample now and then one every ``every`` seconds."""
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="redis-sampler", daemon=True)
        self._thread.start()

    def stop(self, origin: float) -> list[RedisSample]:
        """Take a last sample and stop; every sample, ``at`` counted from the wall-clock
        time ``origin``. Raises the Redis error that stopped the sampling, if any."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30.0)  # a sample is bounded by the socket timeout
            self._thread = None
            if self._error is None:
                self._sample()
        if self._error is not None:
            raise self._error
        return [
            RedisSample(at - origin, interval, commands, clients)
            for at, interval, commands, clients in self._samples
        ]

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            if self._thread.ident is not None:  # started
                self._thread.join(30.0)
            self._thread = None
        if self._client is not None:
            self._client.close()
            self._client = None

    def _loop(self) -> None:
        next_at = time.monotonic() + self.every
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += self.every
            try:
                self._sample()
            except redis.RedisError as exc:
                self._error = exc
                return

    def _sample(self) -> None:
        assert self._client is not None, "connect() first"
        pipe = self._client.pipeline(transaction=False)
        pipe.info("stats")
        pipe.info("clients")
        pipe.llen(self.progress_key)
        stats, clients, runs = pipe.execute()
        now = time.time()
        total = int(stats["total_commands_processed"])  # not counting the INFO stats that read it
        self.expensive_runs = int(runs)
        if self._last is not None:
            then, previous = self._last
            # Between the two readings the server ran the previous sample's three commands.
            commands = max(0, total - previous - self.OWN_COMMANDS)
            connected = int(clients["connected_clients"]) - self.baseline_clients
            self._samples.append((now, now - then, commands, connected))
        self._last = (now, total)


@contextmanager
def sampled(url: str, progress_key: str, every: float = SAMPLE_SECONDS) -> Iterator[RedisSampler]:
    """A connected :class:`RedisSampler`, stopped and closed on the way out."""
    sampler = RedisSampler(url, progress_key, every)
    try:
        sampler.connect()
        yield sampler
    finally:
        sampler.close()
