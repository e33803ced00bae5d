"""The stampede itself: client threads requesting the expensive pages for a
while, each on its own keep-alive connection, recording every request."""

from __future__ import annotations

import http.client
import random
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["ClientCrowd", "Request", "Target"]

_FINISHED_AT = re.compile(rb'data-finished-at="([0-9.]+)"')


@dataclass(frozen=True)
class Target:
    """One page (``page`` names it, ``path`` is its URL path) on one server process."""

    port: int
    path: str
    page: str


@dataclass(frozen=True)
class Request:
    """One request as a client saw it.

    ``sent`` is seconds since the run started; ``age`` is how old the
    expensive content in the response was when it was asked for (``None`` when
    the response had none, e.g. an error).
    """

    page: str
    sent: float
    latency: float
    status: int
    age: float | None
    error: str | None = None


@dataclass
class ClientCrowd:
    """``clients`` threads, client ``i`` on ``targets[i % len(targets)]``,
    each requesting, pausing about ``think`` seconds, and again, until stopped."""

    targets: Sequence[Target]
    clients: int
    think: float
    timeout: float = 30.0  # a bound on every request, so stop() always returns
    started: float = field(default=0.0, init=False)
    _records: list[list[Request]] = field(default_factory=list, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _threads: list[threading.Thread] = field(default_factory=list, init=False)

    def start(self) -> None:
        self.started = time.time()
        self._records = [[] for _ in range(self.clients)]
        for index in range(self.clients):
            target = self.targets[index % len(self.targets)]
            thread = threading.Thread(
                target=self._client, args=(target, self._records[index]), name=f"client-{index}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def count(self) -> int:
        """Requests completed so far (a racy read, fine for a progress bar)."""
        return sum(len(records) for records in self._records)

    def stop(self) -> list[Request]:
        """Stop every client after its current request; every request, by time sent."""
        self._stop.set()
        for thread in self._threads:
            if thread.ident is not None:  # started
                thread.join(self.timeout + 5.0)  # a request is bounded by its socket timeout
        return sorted((r for records in self._records for r in records), key=lambda r: r.sent)

    def _client(self, target: Target, records: list[Request]) -> None:
        rng = random.Random()
        connection: http.client.HTTPConnection | None = None
        # Spread the first requests over one pause, as real clients arrive.
        if self._stop.wait(rng.uniform(0, self.think)):
            return
        while not self._stop.is_set():
            if connection is None:
                connection = http.client.HTTPConnection("127.0.0.1", target.port, timeout=self.timeout)
            begin = time.time()  # wall clock: compared with the page's own timestamp
            clock = time.perf_counter()  # for the latency
            try:
                # One Host for every server process, as behind a load balancer:
                # cache_page keys pages by their absolute URL.
                connection.request("GET", target.path, headers={"Host": "localhost"})
                response = connection.getresponse()
                body = response.read()
            except (OSError, http.client.HTTPException) as exc:
                latency = time.perf_counter() - clock
                connection.close()
                connection = None
                records.append(Request(target.page, begin - self.started, latency, 0, None, repr(exc)))
            else:
                latency = time.perf_counter() - clock
                match = _FINISHED_AT.search(body)
                age = begin - float(match.group(1)) if match else None
                error = None if response.status == 200 else f"HTTP {response.status}"
                records.append(
                    Request(target.page, begin - self.started, latency, response.status, age, error)
                )
            self._stop.wait(rng.uniform(0.5, 1.5) * self.think)
        if connection is not None:
            connection.close()
