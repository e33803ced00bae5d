"""A crowd at one cold page of a test app under waitress, and the slow render
its views count.

The app runs in a server process of its own (:class:`support.app_servers.AppServer`):
its Redis connections are its own to count, and a test can always stop it.
Its views call :func:`render`, counted in a file the test names.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import os
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import stampede
from stampede.testing import RedisServer
from support.app_servers import AppServer
from tests.helpers import wait_until

#: The directory holding the ``tests`` package: the server imports the apps from there.
ROOT = Path(__file__).resolve().parents[1]
_RENDERS = "STAMPEDE_TEST_RENDERS"

#: Seconds one render takes: long enough for a whole crowd to arrive meanwhile.
RENDER_SECONDS = 0.5


def render() -> str:
    """The views' slow part, run in the server process: counted in the file the
    test named (one byte per render, appended atomically), then slept.
    Each render's body is its own, so identical bodies mean one render."""
    fd = os.open(os.environ[_RENDERS], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, b".")
    finally:
        os.close(fd)
    time.sleep(RENDER_SECONDS)
    return f"render {uuid.uuid4().hex}"


class CrowdServer:
    """``app`` (an import path, ``module:attribute``, with ``env`` on top of this
    process's environment) under waitress with ``threads`` threads; renders are
    counted in ``workdir / "renders"`` and the server's output goes to
    ``workdir / "server.log"``. Its ``/ping`` answers once it is up."""

    def __init__(self, app: str, env: Mapping[str, str], *, threads: int, workdir: Path) -> None:
        self.renders_file = workdir / "renders"
        self.server = AppServer(
            app,
            "waitress",
            threads=threads,
            env={**env, _RENDERS: str(self.renders_file)},
            pythonpath=[ROOT],
            log=workdir / "server.log",
            ready_path="/ping",
            # Killed at once: it keeps nothing worth a graceful exit, and a stuck
            # server must not hold up the test.
            stop_grace=0,
        )

    def __enter__(self) -> CrowdServer:
        self.server.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.server.__exit__(kind, error, tb)

    def output(self) -> str:
        """What the server printed (tracebacks of failed requests), for failure messages."""
        return self.server.output()

    def renders(self) -> int:
        """How many renders have begun in the server."""
        try:
            return self.renders_file.stat().st_size
        except FileNotFoundError:
            return 0

    def crowd(self, path: str, n: int, *, timeout: float = 60) -> list[tuple[int, str]]:
        """``GET path`` from ``n`` threads at once: each connects first, then all
        send together. Each answer is ``(status, body)``, or ``(0, what went
        wrong)`` when there was none (within ``timeout`` seconds, say)."""
        answers = [(0, f"no answer within {timeout:g} s")] * n
        barrier = threading.Barrier(n)

        def one(index: int) -> None:
            connection = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=timeout)
            try:
                connection.connect()
                barrier.wait(timeout)
                connection.request("GET", path)
                response = connection.getresponse()
                answers[index] = (response.status, response.read().decode())
            except Exception as exc:
                barrier.abort()  # the others are released rather than left waiting
                answers[index] = (0, f"{type(exc).__name__}: {exc}")
            finally:
                connection.close()

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 2 * timeout + 5  # connecting, then answering
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return list(answers)


class Readers:
    """``clients`` threads reading ``paths`` of the server at ``port`` in turn,
    over and over, each on a keep-alive connection of its own, from ``with``
    until its end; :attr:`answers` holds ``(status, body)`` in the order they came."""

    def __init__(self, port: int, paths: list[str], clients: int, *, timeout: float = 60) -> None:
        self.port = port
        self.paths = paths
        self.timeout = timeout
        self.answers: list[tuple[int, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._read, args=(i,), daemon=True) for i in range(clients)]

    def _read(self, first: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        turn = first
        try:
            while not self._stop.is_set():
                path = self.paths[turn % len(self.paths)]
                turn += 1
                try:
                    connection.request("GET", path)
                    response = connection.getresponse()
                    answer = (response.status, response.read().decode())
                except Exception as exc:
                    answer = (0, f"{type(exc).__name__}: {exc}")
                    connection.close()
                with self._lock:
                    self.answers.append(answer)
        finally:
            connection.close()

    def count(self) -> int:
        """How many answers came so far."""
        with self._lock:
            return len(self.answers)

    def __enter__(self) -> Readers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout + 5)


#: The group the served tests invalidate: pages, readers, and how many renders make a page.
PAGES, READERS = 40, 16


def group_invalidated_while_read(
    app: CrowdServer, url: str, namespace: str, how: str
) -> list[tuple[int, str]]:
    """Fill the 40 tagged pages, then keep 16 clients reading them while the
    group is invalidated (``how``) from another process's instance; returns
    the answers given once the group was invalidated."""
    paths = [f"/tagged/{number}" for number in range(PAGES)]
    with concurrent.futures.ThreadPoolExecutor(READERS) as filling:  # as many at once as the server serves
        statuses = list(filling.map(lambda path: app.server.get(path)[0], paths))
    assert statuses == [200] * PAGES, app.output()
    assert app.renders() == PAGES
    with (
        stampede.Stampede.from_url(url, namespace=namespace) as elsewhere,
        Readers(app.server.port, paths, READERS) as readers,
    ):
        wait_until(lambda: readers.count() > 2 * PAGES)  # every reader reading
        since = readers.count()
        getattr(elsewhere, how)("crowd-group")
        wait_until(lambda: app.renders() >= 2 * PAGES, timeout=60)
        settled = readers.count()
        wait_until(lambda: readers.count() > settled + 2 * PAGES)  # and read after
    return readers.answers[since:]


def read_through_an_outage(
    app: CrowdServer, server: RedisServer, paths: list[str], clients: int, fault: str
) -> tuple[list[int], int, int]:
    """``clients`` readers of ``paths`` on ``app`` while its Redis ``server``
    is ``"stopped"`` or ``"frozen"`` (SIGSTOP), then back: each reader gets
    at least four answers during the fault and four after. Returns every
    answer's status, the renders begun during the fault and the answers
    counted during it."""
    with Readers(app.server.port, paths, clients, timeout=30) as readers:
        wait_until(lambda: readers.count() >= clients)
        away, renders_before = readers.count(), app.renders()
        server.pause() if fault == "frozen" else server.stop()
        try:
            wait_until(lambda: readers.count() >= away + 4 * clients, timeout=60)
        finally:
            server.resume() if fault == "frozen" else server.start()
        back, renders_away = readers.count(), app.renders() - renders_before
        wait_until(lambda: readers.count() >= back + 4 * clients, timeout=60)
    return [status for status, _ in readers.answers], renders_away, back - away
