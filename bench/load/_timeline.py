"""The sustained-load scenario's slow render, logged so that any server process can run it and the
load's driver can tell, afterwards, when each render began and ended.

Each page has a timeline of its own: two files, appended to with ``O_APPEND``
(one write each, so lines from several processes never interleave):
``<page>.begun`` gets one byte as a render starts, ``<page>.done`` one line
``"<start> <end>"`` (wall-clock seconds) as it ends. While the file ``gate``
exists every render waits, begun but not done (at most :data:`GATE_LIMIT`
seconds): a test closes the gate to hold a render open while it looks at what
everyone else gets meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GATE", "GATE_LIMIT", "Render", "Timeline"]

#: The gate's file name, in a run's directory.
GATE = "gate"

#: Seconds a render waits at most for a closed gate to open.
GATE_LIMIT = 60.0
_GATE_POLL = 0.01


@dataclass(frozen=True)
class Render:
    """One render that ended: when it began and ended (wall clock)."""

    start: float
    end: float


class Timeline:
    """The renders of the page ``page`` in one run, across threads and processes, in the directory
    ``root``."""

    def __init__(self, root: str | os.PathLike[str], page: str) -> None:
        self.root = Path(root)
        self.begun_file = self.root / f"{page}.begun"
        self.done_file = self.root / f"{page}.done"
        self.gate_file = self.root / GATE

    # --- the server's side -------------------------------------------------------

    def render(self, seconds: float) -> bytes:
        """The slow render, blocking: logged, held while the gate is closed, ``seconds`` long."""
        start = self._begin()
        deadline = time.monotonic() + GATE_LIMIT
        while self.gate_file.exists() and time.monotonic() < deadline:
            time.sleep(_GATE_POLL)
        time.sleep(seconds)
        return self._end(start)

    async def arender(self, seconds: float) -> bytes:
        """The slow render as a coroutine, as an asyncio application writes it."""
        start = self._begin()
        deadline = time.monotonic() + GATE_LIMIT
        while self.gate_file.exists() and time.monotonic() < deadline:
            await asyncio.sleep(_GATE_POLL)
        await asyncio.sleep(seconds)
        return self._end(start)

    def finished(self) -> int:
        """How many renders have ended."""
        return len(self.renders())

    def _begin(self) -> float:
        _append(self.begun_file, b".")
        return time.time()

    def _end(self, start: float) -> bytes:
        end = time.time()
        _append(self.done_file, f"{start:.6f} {end:.6f}\n".encode())
        return f"rendered at {end:.6f}".encode()

    # --- the driver's side --------------------------------------------------------

    def begun(self) -> int:
        """How many renders have begun."""
        try:
            return self.begun_file.stat().st_size
        except FileNotFoundError:
            return 0

    def renders(self) -> list[Render]:
        """The renders that ended, by start time."""
        try:
            lines = self.done_file.read_text().splitlines()
        except FileNotFoundError:
            return []
        found = [Render(*map(float, line.split())) for line in lines if line.strip()]
        return sorted(found, key=lambda render: render.start)


def _append(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
