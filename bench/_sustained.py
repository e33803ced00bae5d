"""Load that lasts: an app under a real server, clients asking for one cached page again and again
across several expiries, and what it cost: renders (and whether any two fell in one window), HTTP
errors, the slowest answers, and the most Redis connections any one server process held.

Used by the sustained-load scenario (:mod:`bench.sustained`) and by the tests, which run the same
load shorter. The app is ``bench._apps.sustained_django`` or ``bench._apps.sustained_flask``,
served by one of :data:`SERVERS` in a session of its own, always stopped.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import importlib.util
import itertools
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import psutil

from ._apps.sustained_config import AppConfig, Backend
from ._appserver import SOURCE_ROOT, errors_in_log, free_port, tail
from ._stats import percentile
from ._timeline import GATE, Render, Timeline

__all__ = [
    "SERVERS",
    "Load",
    "Meanwhile",
    "Outcome",
    "Served",
    "Server",
    "ServerError",
    "app",
    "crowd",
    "drive",
    "load",
    "meanwhile",
    "run",
    "serve",
    "window_overlaps",
]

#: Seconds a server has to import its framework and answer ``/ready``.
READY_TIMEOUT = 60.0
#: Seconds between two looks at the server processes' Redis connections.
SAMPLE_INTERVAL = 0.05


@dataclass(frozen=True)
class Server:
    """A way to serve an app: the command line, given the app's module and a port."""

    name: str
    label: str
    interface: Literal["wsgi", "asgi"]
    command: tuple[str, ...]  # "{app}" and "{port}" are filled in
    modules: tuple[str, ...]
    #: Whether a request that waits holds no worker (an event loop's task, a greenlet) rather than
    #: one of a fixed number of threads or processes, so that other requests are served meanwhile.
    waits_free: bool = True

    def argv(self, app: str, port: int) -> list[str]:
        return [sys.executable, *(part.format(app=app, port=port) for part in self.command)]

    def missing(self) -> list[str]:
        """The modules this server needs that cannot be imported here."""
        return [module for module in self.modules if importlib.util.find_spec(module) is None]


_BIND = "127.0.0.1:{port}"
_GUNICORN = ("-m", "gunicorn", "-b", _BIND, "--backlog", "2048", "--timeout", "120", "--log-level", "warning")
_UVICORN = (
    *("-m", "uvicorn", "{app}", "--port", "{port}", "--log-level", "warning", "--no-access-log"),
    *("--lifespan", "off", "--backlog", "2048"),
)

#: The servers people deploy with, by name.
SERVERS: dict[str, Server] = {
    server.name: server
    for server in (
        Server(
            "gunicorn-sync",
            "gunicorn -w 8 --preload",
            "wsgi",
            (*_GUNICORN, "-w", "8", "--preload", "{app}"),
            ("gunicorn",),
            waits_free=False,
        ),
        Server(
            "gunicorn-gthread",
            "gunicorn -k gthread -w 2 --threads 40",
            "wsgi",
            (*_GUNICORN, "-k", "gthread", "-w", "2", "--threads", "40", "{app}"),
            ("gunicorn",),
            waits_free=False,
        ),
        Server(
            "gunicorn-gevent",
            "gunicorn -k gevent -w 2",
            "wsgi",
            (*_GUNICORN, "-k", "gevent", "-w", "2", "--worker-connections", "1000", "{app}"),
            ("gunicorn", "gevent"),
        ),
        Server("uvicorn", "uvicorn", "asgi", (*_UVICORN, "--workers", "1"), ("uvicorn",)),
        Server("uvicorn-2", "uvicorn --workers 2", "asgi", (*_UVICORN, "--workers", "2"), ("uvicorn",)),
        Server(
            "gunicorn-uvicorn",
            "gunicorn -k uvicorn_worker.UvicornWorker -w 2",
            "asgi",
            (*_GUNICORN, "-k", "uvicorn_worker.UvicornWorker", "-w", "2", "{app}"),
            ("gunicorn", "uvicorn_worker"),
        ),
        Server(
            "hypercorn",
            "hypercorn -w 2",
            "asgi",
            ("-m", "hypercorn", "-w", "2", "-b", _BIND, "--backlog", "2048", "{app}"),
            ("hypercorn",),
        ),
        Server(
            "daphne",
            "daphne",
            "asgi",
            ("-m", "daphne", "-b", "127.0.0.1", "-p", "{port}", "{app}"),
            ("daphne",),
        ),
    )
}

#: The app modules, and the attribute each interface serves.
_TARGETS = {
    ("django", "wsgi"): "bench._apps.sustained_django:wsgi",
    ("django", "asgi"): "bench._apps.sustained_django:application",
    ("flask", "wsgi"): "bench._apps.sustained_flask:app",
    ("flask", "asgi"): "bench._apps.sustained_flask:asgi_app",
}


class ServerError(RuntimeError):
    """An app server did not start, or died; the message carries the end of its log."""


@dataclass
class Served:
    """A running app server: its port, its log, its pages' render timelines and its processes."""

    server: Server
    framework: Literal["django", "flask"]
    config: AppConfig
    port: int
    log: Path
    process: subprocess.Popen[bytes]

    def timeline(self, path: str) -> Timeline:
        """The renders of the page at ``path``."""
        return Timeline(self.config.timeline, path.strip("/"))

    def close_gate(self) -> None:
        """Hold every render open (begun, not ended) until :meth:`open_gate`."""
        Path(self.config.timeline, GATE).touch()

    def open_gate(self) -> None:
        Path(self.config.timeline, GATE).unlink(missing_ok=True)

    def check(self) -> None:
        if self.process.poll() is not None:
            raise ServerError(
                f"{self.server.label} exited with code {self.process.returncode}:\n{tail(self.log)}"
            )

    def processes(self) -> list[psutil.Process]:
        """The server's processes: its master, if it has one, and its workers."""
        try:
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def get(self, path: str, timeout: float = 30.0) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def errors(self) -> collections.Counter[str]:
        """The exceptions the server's log shows, counted."""
        return errors_in_log(self.log)


@contextlib.contextmanager
def serve(server: Server, framework: Literal["django", "flask"], config: AppConfig) -> Iterator[Served]:
    """Run the sustained-load app of ``framework`` under ``server``, ready to serve; stopped on the
    way out, whatever happens (its whole session, so no worker outlives it)."""
    target = _TARGETS[framework, server.interface]
    environment = {**os.environ, **config.to_env()}
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(SOURCE_ROOT), environment.get("PYTHONPATH")])
    )
    port = free_port()
    log = Path(config.timeline) / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            server.argv(target, port),
            env=environment,
            cwd=SOURCE_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    served = Served(server, framework, config, port, log, process)
    try:
        _wait_ready(served)
        yield served
    finally:
        _stop(process)


def _wait_ready(served: Served) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        served.check()
        with contextlib.suppress(OSError, http.client.HTTPException):
            if served.get("/ready", timeout=2.0)[0] == 200:
                return
        if time.monotonic() > deadline:
            raise ServerError(
                f"{served.server.label} did not answer in {READY_TIMEOUT:.0f} s:\n{tail(served.log)}"
            )
        time.sleep(0.1)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's session (a graceful stop), then SIGKILL if it lingers."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(5.0)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # workers that outlived their master too
    process.wait()


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
            ping: tuple[int, bytes] | str = served.get("/ping", timeout=patience)
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
) -> Iterator[Served]:
    """The sustained-load app of ``framework`` on ``backend`` under ``server``, in a working
    directory of its own (its log, its timelines), removed on the way out."""
    with tempfile.TemporaryDirectory(prefix="stampede-sustained-") as workdir:
        config = AppConfig(backend, redis_url, namespace, ttl, stale_ttl, render_seconds, workdir)
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
    served.check()
    timeline = served.timeline(path)
    return Outcome(
        server=served.server.name,
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
        server_errors=served.errors(),
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
