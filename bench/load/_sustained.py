"""Load that lasts: an app under a real server, clients asking for one cached page again and again
across several expiries, and what it cost: renders (and whether any two fell in one window), HTTP
errors, the slowest answers, and the most Redis connections any one server process held.

Used by the sustained-load scenario (:mod:`bench.load.sustained`) and by the tests, which run the same
load shorter. The app is ``bench.load._apps.sustained_django`` or ``bench.load._apps.sustained_flask``,
served by one of :data:`support.app_servers.SERVERS` (:class:`AppServer`: a process group
of its own, always stopped).
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import itertools
import math
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import psutil

from support.app_servers import AppServer, Server

from .._common.stats import percentile
from ._apps import app_server
from ._apps.sustained_config import AppConfig, Backend
from ._timeline import GATE, Render, Timeline

__all__ = [
    "Load",
    "Meanwhile",
    "Outcome",
    "Served",
    "app",
    "crowd",
    "drive",
    "load",
    "meanwhile",
    "run",
    "serve",
    "window_overlaps",
]

#: Seconds between two looks at the server processes' Redis connections.
SAMPLE_INTERVAL = 0.05

#: The app modules, and the attribute each interface serves.
_TARGETS = {
    ("django", "wsgi"): "sustained_django:wsgi",
    ("django", "asgi"): "sustained_django:application",
    ("flask", "wsgi"): "sustained_flask:app",
    ("flask", "asgi"): "sustained_flask:asgi_app",
}


@dataclass
class Served:
    """A running app server, its app's configuration and its pages' render timelines."""

    app_server: AppServer
    framework: Literal["django", "flask"]
    config: AppConfig

    @property
    def port(self) -> int:
        return self.app_server.port

    def timeline(self, path: str) -> Timeline:
        """The renders of the page at ``path``."""
        return Timeline(self.config.timeline, path.strip("/"))

    def close_gate(self) -> None:
        """Hold every render open (begun, not ended) until :meth:`open_gate`."""
        Path(self.config.timeline, GATE).touch()

    def open_gate(self) -> None:
        Path(self.config.timeline, GATE).unlink(missing_ok=True)

    def processes(self) -> list[psutil.Process]:
        """The server's processes: its master, if it has one, and its workers."""
        found = []
        for pid in self.app_server.pids():
            with contextlib.suppress(psutil.NoSuchProcess):
                found.append(psutil.Process(pid))
        return found


@contextlib.contextmanager
def serve(server: Server, framework: Literal["django", "flask"], config: AppConfig) -> Iterator[Served]:
    """Run the sustained-load app of ``framework`` under ``server``, ready to serve; stopped on the
    way out, whatever happens (its whole process group, so no worker outlives it)."""
    with app_server(
        _TARGETS[framework, server.interface],
        server,
        env=config.to_env(),
        name=f"{framework} ({server.described})",
        workdir=config.timeline,
    ) as running:
        yield Served(running, framework, config)


class ConnectionSampler:
    """``with ConnectionSampler(served, redis_port) as sampler: ...``; then ``sampler.peak`` is the
    most connections to Redis any one server process held at once (sampled, so a lower bound)."""

    def __init__(self, served: Served, redis_port: int) -> None:
        self._served = served
        self._port = redis_port
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="sustained-connections", daemon=True)
        self.peak = 0
        self.processes = 0

    def sample(self) -> None:
        processes = self._served.processes()
        self.processes = max(self.processes, len(processes))
        for process in processes:
            with contextlib.suppress(psutil.Error):
                held = sum(
                    1
                    for connection in process.net_connections(kind="tcp")
                    if connection.raddr and connection.raddr.port == self._port
                )
                self.peak = max(self.peak, held)

    def _poll(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL):
            self.sample()

    def __enter__(self) -> ConnectionSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(10.0)
        self.sample()


@dataclass
class Load:
    """What ``clients`` clients got asking for one page again and again for ``seconds`` seconds."""

    statuses: collections.Counter[str] = field(default_factory=collections.Counter)
    latencies: list[float] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return len(self.latencies)

    @property
    def failed(self) -> int:
        """Answers other than 200, and requests that got no answer."""
        return sum(count for status, count in self.statuses.items() if status != "200")

    def slowest(self, q: float = 99.0) -> float:
        return percentile(self.latencies, q)


def drive(port: int, path: str, *, clients: int, seconds: float, timeout: float = 30.0) -> Load:
    """``clients`` threads, each on its own keep-alive connection, asking for ``path`` one request
    after another until ``seconds`` have passed."""
    load = Load()
    lock = threading.Lock()
    end = math.inf

    def start() -> None:  # run once, by the last client to reach the barrier
        nonlocal end
        end = time.monotonic() + seconds

    barrier = threading.Barrier(clients, action=start)

    def client() -> None:
        connection: http.client.HTTPConnection | None = None
        barrier.wait(60.0)
        while time.monotonic() < end:
            started = time.monotonic()
            try:
                if connection is None:
                    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
                connection.request("GET", path)
                response = connection.getresponse()
                response.read()
                status = str(response.status)
                if response.will_close:
                    connection.close()
                    connection = None
            except (OSError, http.client.HTTPException) as exc:
                status = type(exc).__name__
                if connection is not None:
                    connection.close()
                connection = None
            with lock:
                load.statuses[status] += 1
                load.latencies.append(time.monotonic() - started)
        if connection is not None:
            connection.close()

    threads = [
        threading.Thread(target=client, name=f"sustained-client-{i}", daemon=True) for i in range(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + timeout + 60.0)
    return load


def crowd(port: int, path: str, n: int, *, timeout: float = 60.0) -> list[tuple[int, bytes] | str]:
    """``n`` requests for ``path`` at once, each on a connection of its own: their answers, or the
    error each got."""
    results: list[tuple[int, bytes] | str] = ["not answered"] * n
    barrier = threading.Barrier(n)

    def one(index: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            connection.connect()
            barrier.wait(60.0)
            connection.request("GET", path)
            response = connection.getresponse()
            results[index] = (response.status, response.read())
        except (OSError, http.client.HTTPException, threading.BrokenBarrierError) as exc:
            results[index] = f"{type(exc).__name__}: {exc}"
        finally:
            connection.close()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 60.0)
    return results


@dataclass(frozen=True)
class Meanwhile:
    """What :func:`meanwhile` saw."""

    #: ``/ping``'s answer, asked while the crowd waited: (status, renders ended by then).
    ping: tuple[int, bytes] | str
    #: The crowd's answers, once the render was let go.
    crowd: list[tuple[int, bytes] | str]
    #: Renders of the page begun in all.
    begun: int


def meanwhile(served: Served, path: str, n: int, *, patience: float = 30.0) -> Meanwhile:
    """Hold the renders of the cold page ``path`` open, send ``n`` requests for it together, and
    once a render has begun ask for ``/ping`` (an uncached page); then let the render go."""
    timeline = served.timeline(path)
    served.close_gate()
    try:
        answers: list[list[tuple[int, bytes] | str]] = []
        waiting = threading.Thread(target=lambda: answers.append(crowd(served.port, path, n)), daemon=True)
        waiting.start()
        deadline = time.monotonic() + patience
        while timeline.begun() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            ping: tuple[int, bytes] | str = served.app_server.get("/ping", timeout=patience)
        except (OSError, http.client.HTTPException) as exc:
            ping = f"{type(exc).__name__}: {exc}"
    finally:
        served.open_gate()
    waiting.join(patience + 120.0)
    return Meanwhile(ping, answers[0] if answers else [], timeline.begun())


def window_overlaps(
    renders: Sequence[Render], ttl: float, slack: float = 0.05
) -> list[tuple[Render, Render]]:
    """The pairs of renders in one window: a render that began before the one before it had ended
    and its page had been fresh for ``ttl`` (the page it stored could not have been stale yet)."""
    return [
        (before, after)
        for before, after in itertools.pairwise(renders)
        if after.start < before.end + ttl - slack
    ]


@dataclass(frozen=True)
class Outcome:
    """One run of the load."""

    server: str
    framework: str
    path: str
    backend: Backend
    clients: int
    seconds: float
    ttl: float
    render_seconds: float
    load: Load
    renders: list[Render]
    begun: int
    server_errors: collections.Counter[str]
    peak_connections: int
    processes: int

    @property
    def overlaps(self) -> list[tuple[Render, Render]]:
        return window_overlaps(self.renders, self.ttl)

    def describe(self) -> str:
        errors = ", ".join(f"{count} x {name}" for name, count in self.server_errors.most_common(3)) or "none"
        return (
            f"{self.framework} {self.path} under {self.server} ({self.backend}): {self.begun} renders "
            f"({len(self.overlaps)} in a window already rendered), {self.load.requests} requests, "
            f"statuses {dict(self.load.statuses)}, server errors: {errors}, "
            f"peak Redis connections per process {self.peak_connections}"
        )


@contextlib.contextmanager
def app(
    server: Server,
    framework: Literal["django", "flask"],
    *,
    backend: Backend,
    redis_url: str,
    namespace: str,
    ttl: int,
    render_seconds: float,
    stale_ttl: float = 60.0,
    lease_ttl: float = 5.0,
) -> Iterator[Served]:
    """The sustained-load app of ``framework`` on ``backend`` under ``server``, in a working
    directory of its own (its log, its timelines), removed on the way out."""
    with tempfile.TemporaryDirectory(prefix="stampede-sustained-") as workdir:
        config = AppConfig(backend, redis_url, namespace, ttl, stale_ttl, render_seconds, workdir, lease_ttl)
        with serve(server, framework, config) as served:
            yield served


def load(served: Served, path: str, *, clients: int, seconds: float) -> Outcome:
    """Drive ``clients`` clients at ``path`` for ``seconds``, and tell what it cost. The server's
    errors are those its log shows since it started."""
    config = served.config
    redis_port = urlsplit(config.redis_url).port or 6379
    with ConnectionSampler(served, redis_port) as sampler:
        outcome = drive(served.port, path, clients=clients, seconds=seconds)
        time.sleep(config.render_seconds)  # a render the last requests started ends and is logged
    served.app_server.check()
    timeline = served.timeline(path)
    return Outcome(
        server=served.app_server.server.name,
        framework=served.framework,
        path=path,
        backend=config.backend,
        clients=clients,
        seconds=seconds,
        ttl=config.ttl,
        render_seconds=config.render_seconds,
        load=outcome,
        renders=timeline.renders(),
        begun=timeline.begun(),
        server_errors=served.app_server.errors(),
        peak_connections=sampler.peak,
        processes=sampler.processes,
    )


def run(
    server: Server,
    framework: Literal["django", "flask"],
    path: str,
    *,
    backend: Backend,
    redis_url: str,
    namespace: str,
    clients: int,
    seconds: float,
    ttl: int,
    render_seconds: float,
) -> Outcome:
    """Serve the app, drive ``clients`` clients at ``path`` for ``seconds``, and tell what it cost."""
    with app(
        server,
        framework,
        backend=backend,
        redis_url=redis_url,
        namespace=namespace,
        ttl=ttl,
        render_seconds=render_seconds,
    ) as served:
        return load(served, path, clients=clients, seconds=seconds)
