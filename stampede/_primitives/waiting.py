"""Waiting, by flavour: events with a timeout, locks, sleeping, and whether a caller may block."""

from __future__ import annotations

import asyncio
import threading
import time
from types import TracebackType


def on_event_loop_thread() -> bool:
    """Whether this thread is running an event loop, which a blocking wait would freeze."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


# --- waiting: events, locks, sleeping ----------------------------------------


class AsyncEvent:
    """An ``asyncio.Event`` whose ``wait`` takes a timeout, as a thread's does."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self, timeout: float | None = None) -> bool:
        """Whether it was set (``False``: ``timeout`` seconds passed first)."""
        if timeout is None:
            await self._event.wait()
            return True
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except asyncio.TimeoutError:
            return self._event.is_set()
        return True


Event = threading.Event

#: A lock held across ``await``: one task at a time.
AsyncLock = asyncio.Lock
Lock = threading.Lock


class AsyncSectionLock:
    """A lock around a section with no ``await`` in it: under asyncio a task
    cannot be interrupted there, so none is needed; threads need a real one."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


SectionLock = threading.Lock


async def async_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


sleep = time.sleep


def async_can_block() -> bool:
    """Whether a caller may wait for another's rebuild: a task always may."""
    return True


def can_block() -> bool:
    """Whether a caller may wait for another's rebuild: not a blocking call
    made on an event loop's thread, which the wait would freeze."""
    return not on_event_loop_thread()


def async_current_owner() -> object:
    """Who runs this call, as a unit of work's leases tell their readers apart:
    its asyncio task."""
    task = asyncio.current_task()
    return threading.get_ident() if task is None else task


def current_owner() -> object:
    """Who runs this call: its thread."""
    return threading.get_ident()
