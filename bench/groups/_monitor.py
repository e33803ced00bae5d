"""Commands counted with ``MONITOR`` on an otherwise idle server: those the client sent, and apart
from them those run inside server-side scripts (``INFO``'s ``total_commands_processed`` counts
both, so it cannot tell them apart); and what a warm call costs (:class:`Cost`)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import redis
import redis.asyncio

from ._workload import SOCKET_TIMEOUT

__all__ = ["Cost", "Tally", "monitored"]


@dataclass
class Tally:
    """Commands seen by ``MONITOR``, by name: sent by clients, and run inside scripts."""

    sent: Counter[str] = dataclasses.field(default_factory=Counter)
    scripted: Counter[str] = dataclasses.field(default_factory=Counter)

    def names(self) -> str:
        """``"SPOP 3, UNLINK 2"``: the commands sent, most frequent first."""
        return ", ".join(f"{name} {count}" for name, count in self.sent.most_common()) or "none"


@contextlib.contextmanager
def monitored(url: str) -> Iterator[Tally]:
    """Count the commands the server receives while the body runs (nothing else may use it)."""
    tally = Tally()
    client = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT)
    # The end marker's client, connected now: its connection's handshake is not counted.
    ender = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT)
    marker = f"grouppeers-monitor-end-{os.getpid()}-{time.monotonic_ns()}"
    try:
        ender.ping()
        with client.monitor() as monitor:  # type: ignore[no-untyped-call]
            yield tally
            ender.echo(marker)  # every command the body sent is before it in the stream
            while True:
                raw = monitor.connection.read_response()
                line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
                if marker in line:
                    break
                # 1700000000.123456 [0 127.0.0.1:40000] "GET" "key"   (or [0 lua] inside a script)
                head, _, command = line.partition("] ")
                source = head.rsplit(" ", 1)[-1]
                name = command.split('"')[1].upper() if command.count('"') >= 2 else "?"
                (tally.scripted if source == "lua" else tally.sent)[name] += 1
    finally:
        client.close()
        ender.close()


@dataclass(frozen=True)
class Cost:
    label: str
    sent: float  # commands sent per call
    scripted: float  # commands run inside scripts per call
    names: str
    cpu: float  # seconds of this process's CPU per call
