"""The leases a request holds: ``get`` takes one on a miss, the same request's
``set`` commits it, and whatever is left is settled when the request ends.

Which request is running decides whose leases a call sees, and it is found
where Django leaves a mark, not where a signal receiver could set one (Django
runs ``request_started`` receivers of an ASGI request in tasks and threads of
their own, whose context changes never reach the view):

- Under Django's ASGI handler, a request is everything that runs for it: the
  view's task, the threads its sync code runs in, the tasks it starts. The
  handler enters an asgiref ``ThreadSensitiveContext`` per request, visible in
  all of them; the request's leases are kept under that object, and
  ``request_finished`` (sent from the handler's own task) finds them there.
- Under WSGI, a request is its thread (or greenlet) from ``request_started``
  to ``request_finished``, and the tasks it starts (an async view run by
  ``async_to_sync``): its container lives in a context variable set by the
  receiver, which runs in the request's own context there.
- Outside any request (a script, a worker, start-up code, a test calling the
  cache directly), the leases belong to the thread that took them, and within
  it to one asyncio task at a time: the task that took them, or the first task
  to run after the thread's own code took them (a script's ``asyncio.run``),
  until it ends. No other thread or task sees them, even one whose context was
  copied from there: a miss at start-up in the main thread must not make the
  requests that follow share one container.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from contextvars import ContextVar
from typing import Any

from stampede import Lease

from ._config import CacheConfig
from ._registry import sync_core

try:
    from asgiref.sync import SyncToAsync

    _asgi_request_var: ContextVar[Any] | None = SyncToAsync.thread_sensitive_context
except (ImportError, AttributeError):  # an asgiref without it: WSGI rules everywhere
    _asgi_request_var = None

__all__ = ["begin_request", "defer", "end_request", "forget_all", "hold", "holds", "take", "take_deferred"]


class _Held:
    """One request's (or one thread's or task's) leases and deferred writes."""

    __slots__ = ("deferred", "ended", "leases", "task", "thread")

    def __init__(self, *, owned: bool) -> None:
        self.leases: dict[tuple[CacheConfig, str], Lease] = {}
        # Header lists whose commit waits for their page: (config, lease, value, ttl).
        self.deferred: list[tuple[CacheConfig, Lease, Any, int | None]] = []
        self.ended = False
        # Outside a request: the thread and task that own it (None: a request's, seen by its tasks too).
        self.thread: int | None = None
        self.task: weakref.ref[asyncio.Task[Any]] | None = None
        if owned:
            self.thread = threading.get_ident()
            task = _current_task()
            self.task = None if task is None else weakref.ref(task)

    def is_mine(self) -> bool:
        if self.ended:
            return False
        if self.thread is None:
            return True  # a WSGI request's, inherited by the tasks it started
        if threading.get_ident() != self.thread:
            return False
        task = _current_task()
        if task is None:
            return True
        owner = None if self.task is None else self.task()
        if owner is None:
            # Made by the thread's own code, or by a task that has ended: the
            # first task to use it takes it over (a script's asyncio.run), and
            # tasks running beside that one make their own.
            self.task = weakref.ref(task)
            return True
        return owner is task


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no event loop runs in this thread
        return None


_current: ContextVar[_Held | None] = ContextVar("django_stampede_held", default=None)
# ASGI requests' containers, by the request's ThreadSensitiveContext; an entry
# goes when the request ends, or with the request's last reference.
_by_request: weakref.WeakKeyDictionary[Any, _Held] = weakref.WeakKeyDictionary()
_by_request_lock = threading.Lock()


def _asgi_request() -> Any:
    return None if _asgi_request_var is None else _asgi_request_var.get(None)


def _held(create: bool) -> _Held | None:
    request = _asgi_request()
    if request is not None:
        held = _by_request.get(request)
        if held is None and create:
            with _by_request_lock:
                held = _by_request.get(request)
                if held is None:
                    held = _by_request[request] = _Held(owned=False)
        return held
    held = _current.get()
    if held is not None and held.is_mine():
        return held
    if not create:
        return None
    held = _Held(owned=True)
    _current.set(held)
    return held


def hold(config: CacheConfig, key: str, lease: Lease) -> None:
    held = _held(create=True)
    assert held is not None
    held.leases[config, key] = lease


def holds(config: CacheConfig, key: str) -> bool:
    held = _held(create=False)
    return held is not None and (config, key) in held.leases


def take(config: CacheConfig, key: str) -> Lease | None:
    """Remove and return this request's lease on ``key``, if any."""
    held = _held(create=False)
    return None if held is None else held.leases.pop((config, key), None)


def forget_all(config: CacheConfig) -> None:
    """Forget this request's leases and deferred writes for ``config`` (its ``clear()``)."""
    held = _held(create=False)
    if held is not None:
        for name in [name for name in held.leases if name[0] == config]:
            del held.leases[name]
        held.deferred = [item for item in held.deferred if item[0] != config]


def defer(config: CacheConfig, lease: Lease, value: Any, ttl: int | None) -> None:
    held = _held(create=True)
    assert held is not None
    held.deferred.append((config, lease, value, ttl))


def take_deferred(config: CacheConfig) -> list[tuple[Lease, Any, int | None]]:
    held = _held(create=False)
    if held is None or not held.deferred:
        return []
    mine = [(lease, value, ttl) for owner, lease, value, ttl in held.deferred if owner == config]
    held.deferred = [item for item in held.deferred if item[0] != config]
    return mine


def begin_request(**kwargs: Any) -> None:
    """``request_started`` receiver: a fresh container for the request.

    Under ASGI it is kept under the request's ``ThreadSensitiveContext``
    (this receiver runs in a task and a thread of its own there, so a
    context variable set here would be lost); under WSGI in the request's
    own context."""
    request = _asgi_request()
    if request is not None:
        with _by_request_lock:
            _by_request[request] = _Held(owned=False)
    else:
        _current.set(_Held(owned=False))


def end_request(**kwargs: Any) -> None:
    """``request_finished`` receiver: store the header lists still waiting for
    their page, and free the leases of misses the request never set (its
    view raised, or chose not to cache) so that others rebuild at once."""
    request = _asgi_request()
    if request is not None:
        with _by_request_lock:
            held = _by_request.pop(request, None)
    else:
        held = _current.get()
        if held is None or held.thread is not None:
            return  # not a request's: its thread or task settles it
        _current.set(None)  # nothing copied from this context later sees the ended request
    if held is None:
        return
    held.ended = True
    deferred, held.deferred = held.deferred, []
    leases, held.leases = held.leases, {}
    for config, lease, value, ttl in deferred:
        sync_core(config).commit(lease, value, ttl=ttl, store_if_lapsed=True)
    for (config, _), lease in leases.items():
        sync_core(config).release(lease)
