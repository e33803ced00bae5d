"""A crowd at one cold page of a test app under waitress, and the slow render
its views count.

The app runs in a server process of its own (:class:`stampede.testing._app_servers.AppServer`):
its Redis connections are its own to count, and a test can always stop it.
Its views call :func:`render`, counted in a file the test names.
"""

from __future__ import annotations

import http.client
import os
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from stampede.testing._app_servers import AppServer

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
