"""In-process coalescing: one flight per key per process, shared by callers.

The first caller of a key becomes the flight's leader and goes to Redis;
the others join its flight instead of sending their own lease attempts
and waits. The machines of :mod:`~stampede._core.calls` decide who leads and
what followers do; only the event type differs between the flavours (a
``threading.Event`` or an ``asyncio.Event``), each set by the leader and
waited on through the driver (:class:`~stampede._core.ops.AwaitFlight`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["LocalFlight", "LocalFlights"]


class _Settable(Protocol):
    def set(self) -> None: ...


E = TypeVar("E", bound=_Settable)


class LocalFlight(Generic[E]):
    """One leader's work on one key, and its outcome once ``done`` is set."""

    __slots__ = (
        "_traceback",
        "asked_at",
        "done",
        "error",
        "followers",
        "overtaken",
        "superseded",
        "until",
        "value",
    )

    def __init__(self, done: E) -> None:
        self.done = done
        #: When a flight whose leader may never finish it is given up (monotonic).
        self.until = float("inf")
        self.followers = 0  # callers that joined it rather than go to Redis
        self.value: Any = None
        self.error: BaseException | None = None
        #: The leader's value lost to a newer write: a follower, which may
        #: have been served that newer value already, must read again.
        self.superseded = False
        #: This process wrote the key while the flight was under way: what
        #: the leader read may be older than that write, so callers that
        #: join from then on read again rather than take its outcome.
        self.overtaken = False
        #: When (monotonic) the leader last asked Redis anything. Its outcome
        #: is as of then: a follower that joined later may have come after
        #: another process's write that it does not reflect, and reads again.
        self.asked_at = float("-inf")
        self._traceback: TracebackType | None = None

    @property
    def abandoned(self) -> bool:
        """The leader was cancelled or interrupted: followers must try again
        themselves rather than inherit a cancellation that was not theirs."""
        return self.error is not None and not isinstance(self.error, Exception)

    def asked_before(self, joined: float) -> bool:
        """Whether the leader last asked Redis before ``joined`` (monotonic),
        when a follower joined: its outcome may not reflect a write another
        process made meanwhile, so that follower reads again."""
        return self.asked_at < joined

    def outcome(self) -> Any:
        """The leader's value, or its exception raised here."""
        if self.error is not None:
            # Every follower raises the same object: start from the leader's
            # traceback each time, or each raise would grow it further.
            raise self.error.with_traceback(self._traceback)
        return self.value


class LocalFlights(Generic[E]):
    """The flights under way in this process, by key: a value key, or a
    value key and a phase (the fallback rebuild after a wait timeout)."""

    def __init__(self, new_event: Callable[[], E]) -> None:
        self._new_event = new_event
        self._lock = threading.Lock()
        self._flights: dict[Hashable, LocalFlight[E]] = {}

    def join(self, key: Hashable) -> tuple[LocalFlight[E], bool]:
        """The flight for ``key``, and whether the caller leads it (it is new)."""
        with self._lock:
            flight = self._flights.get(key)
            if flight is not None:
                flight.followers += 1
                return flight, False
            flight = self._flights[key] = LocalFlight(self._new_event())
            return flight, True

    def finish(
        self,
        key: Hashable,
        flight: LocalFlight[E],
        value: Any = None,
        error: BaseException | None = None,
        *,
        superseded: bool = False,
    ) -> None:
        """Record the leader's outcome and wake the followers."""
        with self._lock:
            if self._flights.get(key) is flight:
                del self._flights[key]
        flight.value = value
        flight.error = error
        flight.superseded = superseded
        flight._traceback = error.__traceback__ if error is not None else None
        flight.done.set()

    def follow(self, key: Hashable) -> LocalFlight[E] | None:
        """The flight for ``key``, joined, if one is under way; never a new one."""
        with self._lock:
            flight = self._flights.get(key)
            if flight is not None:
                flight.followers += 1
            return flight

    def overtake(self, *keys: Hashable) -> None:
        """This process wrote to the flights of ``keys``, if any are under way."""
        with self._lock:
            for key in keys:
                flight = self._flights.get(key)
                if flight is not None:
                    flight.overtaken = True

    def followers(self) -> int:
        """How many callers are following a flight now (for tests and metrics)."""
        with self._lock:
            return sum(flight.followers for flight in self._flights.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._flights)
