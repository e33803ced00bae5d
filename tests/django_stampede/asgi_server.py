"""The test project under uvicorn, in a process of its own, and a small HTTP
client on asyncio streams.

A process rather than a thread (:class:`support.app_servers.AppServer`):
a test can always stop it, even when its event loop is stuck in a blocking
call (what these tests look for).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import TracebackType
from typing import Any

from support.app_servers import AppServer
from tests.django_stampede.project import served

#: The directory holding the ``tests`` package: the server imports the project from there.
_ROOT = Path(__file__).resolve().parents[2]


class AsgiServer:
    """uvicorn serving the test project on a free loopback port, with ``caches``
    as its ``CACHES``; its output goes to ``log``."""

    def __init__(self, caches: dict[str, Any], log: Path) -> None:
        self.server = AppServer(
            "tests.django_stampede.project.served:asgi",
            "uvicorn",
            env=served.environment(caches),
            pythonpath=[_ROOT],
            log=log,
            ready_path="/ping/",
            # Killed at once: a stuck loop would not see SIGTERM, and the test's
            # cache is cleared by the test anyway.
            stop_grace=0,
        )

    @property
    def port(self) -> int:
        return self.server.port

    def __enter__(self) -> AsgiServer:
        self.server.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.server.__exit__(kind, error, tb)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def output(self) -> str:
        """What the server printed (tracebacks of failed requests), for failure messages."""
        return self.server.output()[-4000:]

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
