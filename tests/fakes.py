"""Test doubles for time only (never for Redis)."""

from __future__ import annotations


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now
        self.mono = 0.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.mono += seconds
