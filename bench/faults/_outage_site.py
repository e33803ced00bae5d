"""The outage benchmark's sites: the Django page (``bench.load._apps.outage_django``) or the Flask
one (``outage_flask``), by the cache, under a real WSGI server, read by a crowd of keep-alive
clients while its Redis goes away (or slows, or fills) and comes back.

One run (:func:`serve_through`) is one cache and one fault, on a fresh redis-server and a fresh
server process: the page is rendered once, the clients read it in a loop, and after a second's
warm-up (not counted) the fault's phases run (:func:`bench.faults._outages.inflict`).
"""

from __future__ import annotations

import collections
import http.client
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from stampede.testing import RedisServer
from support.app_servers import SERVERS, Server

from ..load._apps import app_server
from ..load._apps.outage_config import FLASK_CACHES, AppConfig, CacheName
from ..load._timeline import Timeline
from ._outages import Boundaries, Fault, Plan, Sample, inflict, reach

__all__ = ["PATH", "Readers", "SiteRun", "serve_through", "site_server"]

PATH = "/page"
#: The page's ``cache_page`` timeout: no expiry within a run.
PAGE_TIMEOUT = 300
#: Seconds the clients read before the first phase, uncounted: every connection made and warm.
WARMUP = 1.0
#: Seconds a client waits for an answer before it gives up (no answer); the server's own timeout
#: (gunicorn's ``--timeout 120``) is longer.
PATIENCE = 60.0


def site_server(clients: int) -> Server | None:
    """gunicorn gthread (2 workers x 40 threads, more than the clients) if installed, else
    waitress with a thread per client and some; ``None`` if neither is."""
    for server in (SERVERS["gunicorn-gthread"], SERVERS["waitress"].with_threads(clients + 10)):
        if not server.missing():
            return server
    return None


class Readers:
    """``clients`` threads asking for ``path`` of the server at ``port`` one request after
    another, each on a keep-alive connection of its own (made again after an error), from
    ``with`` until its end; :attr:`samples` holds every request."""

    def __init__(self, port: int, path: str, clients: int, *, timeout: float) -> None:
        self.port = port
        self.path = path
        self.timeout = timeout
        self.samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._read, name=f"outage-reader-{index}", daemon=True)
            for index in range(clients)
        ]

    def _read(self) -> None:
        connection: http.client.HTTPConnection | None = None
        while not self._stop.is_set():
            start = time.time()
            clock = time.perf_counter()
            try:
                if connection is None:
                    connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
                connection.request("GET", self.path)
                response = connection.getresponse()
                response.read()
                outcome = str(response.status)
                if response.will_close:
                    connection.close()
                    connection = None
            except (OSError, http.client.HTTPException) as exc:
                outcome = type(exc).__name__
                if connection is not None:
                    connection.close()
                connection = None
            sample = Sample(start, time.perf_counter() - clock, outcome)
            with self._lock:
                self.samples.append(sample)
        if connection is not None:
            connection.close()

    def taken(self) -> list[Sample]:
        """The samples so far."""
        with self._lock:
            return list(self.samples)

    def __enter__(self) -> Readers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        deadline = time.monotonic() + self.timeout + 10.0
        for thread in self._threads:
            # A thread still waiting at the deadline is left behind (a daemon): its request is lost.
            thread.join(max(0.0, deadline - time.monotonic()))


@dataclass(frozen=True)
class SiteRun:
    """What the clients of one run got, the page's renders (their start times), and the
    exceptions the server's log shows, counted."""

    bounds: Boundaries
    samples: list[Sample]
    renders: list[float]
    server_errors: collections.Counter[str] = field(default_factory=collections.Counter)


def serve_through(
    cache: CacheName,
    fault: Fault,
    plan: Plan,
    *,
    server: Server,
    clients: int,
    render_seconds: float,
    socket_timeout: float,
    log: Callable[[str], None],
) -> SiteRun:
    """Serve the page on ``cache`` under ``server``, read by ``clients`` clients through ``fault``."""
    with (
        RedisServer() as redis,
        reach(redis, fault) as (url, proxy),
        tempfile.TemporaryDirectory(prefix="stampede-outage-") as workdir,
    ):
        config = AppConfig(
            cache=cache,
            redis_url=url,
            page_timeout=PAGE_TIMEOUT,
            render_seconds=render_seconds,
            socket_timeout=socket_timeout,
            timeline=workdir,
        )
        site = "flask" if cache in FLASK_CACHES else "django"
        with app_server(
            f"outage_{site}:wsgi",
            server,
            env=config.to_env(),
            name=f"outage {site} on {cache} ({server.described})",
            workdir=workdir,
        ) as running:
            status, _ = running.get(PATH)  # rendered once, and cached, before the crowd comes
            if status != 200:
                log(f"  the first GET {PATH} answered {status}")
            with Readers(running.port, PATH, clients, timeout=PATIENCE) as readers:
                time.sleep(WARMUP)
                bounds = inflict(redis, fault, plan, log, proxy)
            time.sleep(render_seconds)  # a render the last requests began ends and is logged
            running.check()
            renders = [render.start for render in Timeline(workdir, "page").renders()]
            return SiteRun(bounds, readers.taken(), renders, running.errors())
