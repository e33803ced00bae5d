"""Event hooks for the tests of ``on_event`` settings, named there by their
dotted paths (``"tests.observers.record"``)."""

from __future__ import annotations

import threading

from stampede import Event, EventKind

RECORDED: list[Event] = []
_lock = threading.Lock()


def record(event: Event) -> None:
    """Keep every event, from any thread."""
    with _lock:
        RECORDED.append(event)


def broken(event: Event) -> None:
    raise RuntimeError("a broken observer")


class Recorder:
    """A hook that keeps every event, for counting them."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)

    def count(self, kind: EventKind) -> int:
        with self._lock:
            return sum(event.kind is kind for event in self.events)


def recorded(namespace: str) -> list[EventKind]:
    """The kinds of the events recorded for ``namespace``, in order."""
    with _lock:
        return [event.kind for event in RECORDED if event.namespace == namespace]
