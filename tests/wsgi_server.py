"""A test app under waitress, in a process of its own, a crowd of HTTP clients
for it, and the slow render its views count.

A process rather than a thread, as in ``tests/django_stampede/asgi_server.py``:
its Redis connections are its own to count, and a test can always stop it.
``python -m tests.wsgi_server FD THREADS APP`` is the server's side; ``APP`` is
``django`` (``CONFIG``: its ``CACHES``) or ``flask`` (``CONFIG``: the app's
config, with ``CROWD_ENTRY`` naming the decorator under test).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
_CONFIG = "STAMPEDE_TEST_WSGI_CONFIG"
_RENDERS = "STAMPEDE_TEST_WSGI_RENDERS"

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


class WsgiServer:
    """``app`` (``"django"`` or ``"flask"``, with ``config``) under waitress with
    ``threads`` threads on a free loopback port; renders are counted in
    ``workdir / "renders"`` and the server's output goes to ``workdir / "server.log"``."""

    def __init__(self, app: str, config: dict[str, Any], *, threads: int, workdir: Path) -> None:
        self.app = app
        self.config = config
        self.threads = threads
        self.log = workdir / "server.log"
        self.renders_file = workdir / "renders"
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> WsgiServer:
        # Bound here and handed over, as AsgiServer does: no race for the port,
        # and the readiness request waits in the backlog until the app is up.
        listener = socket.create_server(("127.0.0.1", 0), backlog=max(1024, 2 * self.threads))
        with listener, self.log.open("wb") as output:
            self.port = listener.getsockname()[1]
            fd = listener.fileno()
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tests.wsgi_server", str(fd), str(self.threads), self.app],
                pass_fds=[fd],
                cwd=_ROOT,
                # Its end tells the server to exit, should this process die without stopping it.
                stdin=subprocess.PIPE,
                env={**os.environ, _CONFIG: json.dumps(self.config), _RENDERS: str(self.renders_file)},
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        try:
            with urllib.request.urlopen(self.url("/ping"), timeout=60) as response:
                assert response.status == 200, self.output()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._process is not None:
            # Killed: it keeps nothing worth a graceful exit, and a stuck
            # server must not hold up the test.
            self._process.kill()
            self._process.wait(10)
            if self._process.stdin is not None:
                self._process.stdin.close()
            self._process = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def output(self) -> str:
        """What the server printed (tracebacks of failed requests), for failure messages."""
        return self.log.read_text(errors="replace")[-4000:]

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
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
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


def _django(caches: dict[str, Any]) -> Any:
    from django.conf import settings

    settings.configure(
        SECRET_KEY="only-for-tests",
        USE_TZ=True,
        INSTALLED_APPS=[],
        ROOT_URLCONF="tests.django_stampede.project.crowd_views",
        MIDDLEWARE=[],
        ALLOWED_HOSTS=["*"],
        CACHES=caches,
        # Tracebacks of failed requests to the log, for the test's failure message.
        LOGGING={
            "version": 1,
            "disable_existing_loggers": False,
            "handlers": {"stderr": {"class": "logging.StreamHandler"}},
            "loggers": {
                "django.request": {"handlers": ["stderr"], "level": "ERROR"},
                "stampede": {"handlers": ["stderr"], "level": "WARNING"},
            },
        },
    )
    from django.core.wsgi import get_wsgi_application

    return get_wsgi_application()


def _flask(config: dict[str, Any]) -> Any:
    from tests.flask_stampede.crowd_app import make_app

    return make_app(config)


def _exit_on_eof() -> None:
    sys.stdin.buffer.read()  # returns when the test process closes the pipe, or dies
    os._exit(0)  # waitress holds the main thread


def main() -> None:
    threading.Thread(target=_exit_on_eof, name="exit-on-eof", daemon=True).start()
    fd, threads, app = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    config = json.loads(os.environ[_CONFIG])
    application = _django(config) if app == "django" else _flask(config)
    import waitress

    waitress.serve(
        application,
        sockets=[socket.socket(fileno=fd)],
        threads=threads,
        # Every client at once is the point: accept them all (the default
        # limit is 100), none left queued in the backlog.
        connection_limit=threads + 100,
        backlog=max(1024, 2 * threads),
        channel_timeout=120,
        # select() fails on descriptors above 1024: poll() has no such limit.
        asyncore_use_poll=True,
        ident="stampede-tests",
    )


if __name__ == "__main__":
    main()
