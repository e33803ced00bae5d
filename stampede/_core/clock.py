"""Where the core reads time: the wall clock for timestamps shared through
Redis, the monotonic clock for waits and durations."""

from __future__ import annotations

import time as _time
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    """Where the flow reads time: wall clock for shared timestamps, monotonic for waits."""

    def time(self) -> float: ...

    def monotonic(self) -> float: ...


class SystemClock:
    """The real clocks."""

    time = staticmethod(_time.time)
    monotonic = staticmethod(_time.monotonic)
