"""The test project under uvicorn, in a process of its own, and a small HTTP
client on asyncio streams.

A process rather than a thread: a test can always stop it, even when its
event loop is stuck in a blocking call (what these tests look for).
``python -m tests.django_stampede.asgi_server FD`` is the server's side.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

_ROOT = Path(__file__).resolve().parents[2]
_CACHES = "STAMPEDE_TEST_ASGI_CACHES"


class AsgiServer:
    """uvicorn serving the test project on a free loopback port, with ``caches``
    as its ``CACHES``; its output goes to ``log``."""

    def __init__(self, caches: dict[str, Any], log: Path) -> None:
        self.caches = caches
        self.log = log
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> AsgiServer:
        # Bound here and handed over: no race for the port, and requests made
        # before the server is up wait in the backlog instead of failing.
        listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
        with listener, self.log.open("wb") as output:
            self.port = listener.getsockname()[1]
            fd = listener.fileno()
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tests.django_stampede.asgi_server", str(fd)],
                pass_fds=[fd],
                cwd=_ROOT,
                env={**os.environ, _CACHES: json.dumps(self.caches)},
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        try:
            with urllib.request.urlopen(self.url("/ping/"), timeout=60) as response:
                assert response.status == 200
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._process is not None:
            # Killed, not terminated: a stuck loop would not see SIGTERM, and
            # the test's cache is cleared by the test anyway.
            self._process.kill()
            self._process.wait(10)
            self._process = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def output(self) -> str:
        """What the server printed (tracebacks of failed requests), for failure messages."""
        return self.log.read_text(errors="replace")[-4000:]

    async def get(self, path: str, *, method: str = "GET", timeout: float = 30) -> tuple[int, str]:
        """The status and body of one request on a connection of its own."""

        async def exchange() -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            try:
                # HTTP/1.0: the body is whatever comes before the server closes.
                writer.write(f"{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
                await writer.drain()
                return await reader.read()
            finally:
                writer.close()

        raw = await asyncio.wait_for(exchange(), timeout)
        head, _, body = raw.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), body.decode().strip()

    async def renders(self, *, gate: str = "") -> int:
        """The renders the server has run; ``gate="close"`` or ``"open"`` first."""
        status, body = await self.get(f"/state/?gate={gate}", timeout=10)
        assert status == 200, self.output()
        return int(body)


def main() -> None:
    from django.conf import settings

    settings.configure(
        SECRET_KEY="only-for-tests",
        USE_TZ=True,
        INSTALLED_APPS=["tests.django_stampede.project"],
        TEMPLATES=[{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}],
        ROOT_URLCONF="tests.django_stampede.project.urls",
        MIDDLEWARE=[],
        ALLOWED_HOSTS=["*"],
        CACHES=json.loads(os.environ[_CACHES]),
        # Tracebacks of failed requests to the log, for the test's failure message.
        LOGGING={
            "version": 1,
            "disable_existing_loggers": False,
            "handlers": {"stderr": {"class": "logging.StreamHandler"}},
            "loggers": {"django.request": {"handlers": ["stderr"], "level": "ERROR"}},
        },
    )
    import uvicorn
    from django.core.asgi import get_asgi_application

    config = uvicorn.Config(get_asgi_application(), lifespan="off", log_level="warning")
    uvicorn.Server(config).run(sockets=[socket.socket(fileno=int(sys.argv[1]))])


if __name__ == "__main__":
    main()
