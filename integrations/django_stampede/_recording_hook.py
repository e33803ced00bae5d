"""The event hook of a cache whose calls are recorded (``OPTIONS["RECORD_CALLS"]``):
each event its core reports goes to the recorded call under way in this
context, if there is one (see ``_recording``). Apart from ``_recording`` so
that the settings, which chain it onto the core's hook, need nothing else."""

from __future__ import annotations

from contextvars import ContextVar

from stampede import Event

__all__ = ["collected", "on_event"]

#: The events of the recorded call under way in this context.
collected: ContextVar[list[Event] | None] = ContextVar("django_stampede_events", default=None)


def on_event(event: Event) -> None:
    """File ``event`` with the recorded call under way, if any."""
    events = collected.get()
    if events is not None:
        events.append(event)
