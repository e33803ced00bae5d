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


def recorded(namespace: str) -> list[EventKind]:
    """The kinds of the events recorded for ``namespace``, in order."""
    with _lock:
        return [event.kind for event in RECORDED if event.namespace == namespace]
