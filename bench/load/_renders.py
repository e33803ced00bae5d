"""The many-waiters scenario's slow render, counted in a file so that any process can run it.

Each render appends one byte to the file before it sleeps, so the count is
the renders that began, whichever process or thread ran them. A file rather
than a Redis counter: counting in Redis would take a connection from the
pool under test and show up in the connection counts being measured.
"""

from __future__ import annotations

import asyncio
import os
import time

__all__ = ["BODY", "ENV", "RENDER_SECONDS", "RenderLog"]

#: The environment variable that tells an app server process where its :class:`RenderLog` is.
ENV = "BENCH_MANY_RENDERS"

#: How long one render (the rebuild every caller is waiting for) takes.
RENDER_SECONDS = 0.5

#: What a render returns, and what a page's body is.
BODY = b"rendered"


class RenderLog:
    """Counts renders across threads and processes: one byte per render in ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def from_env(cls) -> RenderLog:
        """The log named by :data:`ENV` (set by the benchmark for the app servers it starts)."""
        path = os.environ.get(ENV)
        if not path:
            raise RuntimeError(f"{ENV} is not set: run this through `python -m bench manywaiters`")
        return cls(path)

    def mark(self) -> None:
        # O_APPEND makes each one-byte write atomic, across processes too.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, b".")
        finally:
            os.close(fd)

    def count(self) -> int:
        """How many renders have begun."""
        try:
            return os.path.getsize(self.path)
        except FileNotFoundError:
            return 0

    def render(self) -> bytes:
        """The slow rebuild, blocking: counted, then :data:`RENDER_SECONDS` of sleep."""
        self.mark()
        time.sleep(RENDER_SECONDS)
        return BODY

    async def arender(self) -> bytes:
        """The slow rebuild as a coroutine, as an asyncio application would write it."""
        self.mark()
        await asyncio.sleep(RENDER_SECONDS)
        return BODY
