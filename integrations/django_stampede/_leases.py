"""Which unit of work a cache call belongs to, and so which
:class:`stampede.LeaseScope` keeps the leases its ``get`` misses take: one
scope per unit of work and cache, settled when the unit ends.

Which unit of work is running is found where Django leaves a mark, not where
a signal receiver could set one (Django runs ``request_started`` receivers
of an ASGI request in tasks and threads of their own, whose context changes
never reach the view):

- Under Django's ASGI handler, a request is everything that runs for it: the
  view's task, the threads its sync code runs in, the tasks it starts. The
  handler enters an asgiref ``ThreadSensitiveContext`` per request, visible in
  all of them; the request's scopes are kept under that object, and
  ``request_finished`` (sent from the handler's own task) finds them there.
- Under WSGI, a request is its thread (or greenlet) from ``request_started``
  to ``request_finished``, and the tasks it starts (an async view run by
  ``async_to_sync``): its scopes live in a context variable set by the
  receiver, which runs in the request's own context there.
- Inside ``with django_stampede.lease_scope():`` (a Celery task, a
  management command, a job), the block is the unit of work.
- Outside all of these (a script, a worker loop, start-up code), the unit of
  work has no known end: the leases belong to the thread that took them,
  and within it to one asyncio task at a time (the task that took them, or
  the first task to run after the thread's own code took them: a script's
  ``asyncio.run``), until it ends. No other thread or task sees them, even
  one whose context was copied from there. They are not renewed (nothing
  tells when the unit is over), so each lasts until the thread writes the
  key, reads it again (which gives it back), or ``LEASE_TTL`` passes.

Requests and ``lease_scope()`` blocks renew their leases while they run, up
to ``MAX_LEASE_TIME``; a request that raised gives its leases back without
marking their keys as ones that reads do not fill.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import weakref
from collections.abc import Iterator
from contextvars import ContextVar, Token
from operator import methodcaller
from types import TracebackType
from typing import Any

from stampede import Lease, LeaseScope

from ._config import CacheConfig
from ._registry import async_core, sync_core

try:
    from asgiref.sync import SyncToAsync

    _asgi_request_var: ContextVar[Any] | None = SyncToAsync.thread_sensitive_context
except (ImportError, AttributeError):  # an asgiref without it: WSGI rules everywhere
    _asgi_request_var = None

__all__ = [
    "UnitOfWork",
    "begin_request",
    "defer",
    "end_request",
    "fail_request",
    "forget_all",
    "holdings",
    "holds",
    "lease_scope",
    "scope",
    "take",
    "take_deferred",
]


class _Unit:
    """One unit of work's scopes (one per cache) and deferred writes."""

    __slots__ = ("block", "deferred", "ended", "failed", "renew", "scopes", "task", "thread")

    def __init__(self, *, owned: bool, block: bool = False) -> None:
        self.scopes: dict[CacheConfig, LeaseScope] = {}
        # Header lists whose commit waits for their page: (config, lease, value, ttl, stale_ttl).
        self.deferred: list[tuple[CacheConfig, Lease, Any, int | None, float]] = []
        self.ended = False
        self.failed = False
        # A lease_scope() block: found through the context of the code in it,
        # before the request it may run in.
        self.block = block
        # A thread's own reads have no known end: nothing renews their leases.
        self.renew = not owned
        # Outside a unit with an end: the thread and task that own it (None: seen by its tasks too).
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
            return True  # a WSGI request's (or a lease_scope block's), inherited by its tasks
        if threading.get_ident() != self.thread:
            return False
        task = _current_task()
        if task is None:
            return True
        owner = None if self.task is None else self.task()
        if owner is None or owner.done():
            # Made by the thread's own code, or by a task that has ended (gone,
            # or done though something still refers to it): the first task to
            # use it takes it over (a script's asyncio.run), and tasks running
            # beside that one make their own.
            self.task = weakref.ref(task)
            return True
        return owner is task

    def scope(self, config: CacheConfig) -> LeaseScope:
        found = self.scopes.get(config)
        if found is None:
            found = self.scopes[config] = LeaseScope(renew=self.renew)
        return found


def _current_task() -> asyncio.Task[Any] | None:
    if asyncio._get_running_loop() is None:  # cheaper than current_task() raising
        return None
    return asyncio.current_task()


logger = logging.getLogger("django_stampede")

_current: ContextVar[_Unit | None] = ContextVar("django_stampede_unit", default=None)
# ASGI requests' units, by the request's ThreadSensitiveContext; an entry
# goes when the request ends, or with the request's last reference.
_by_request: weakref.WeakKeyDictionary[Any, _Unit] = weakref.WeakKeyDictionary()
_by_request_lock = threading.Lock()


def _asgi_request() -> Any:
    return None if _asgi_request_var is None else _asgi_request_var.get(None)


def _unit(create: bool) -> _Unit | None:
    unit = _current.get()
    if unit is not None and unit.block and not unit.ended:
        return unit  # a lease_scope() block, whose context the code in it runs in
    request = _asgi_request()
    if request is not None:
        found = _by_request.get(request)
        if found is None and create:
            with _by_request_lock:
                found = _by_request.get(request)
                if found is None:
                    found = _by_request[request] = _Unit(owned=False)
        if found is None or not found.ended:
            return found
        # The request ended, and this is a task it left running: its reads
        # are its own, as a thread's outside requests (nothing settles them).
    if unit is not None and unit.is_mine():
        return unit
    if not create:
        return None
    unit = _Unit(owned=not _in_unstarted_request())
    _current.set(unit)
    return unit


#: Whether ``begin_request`` has run in this process: from then on, every
#: request has its unit before its view runs.
_requests_seen = False


def _in_unstarted_request() -> bool:
    """Whether this thread runs a request whose start this module missed: the
    cache was first used in that request's view (nothing touched it at
    start-up), so its receivers were connected after ``request_started`` was
    sent. Only asked until a request start is seen; then it is never so."""
    if _requests_seen:
        return False
    handlers = sys.modules.get("django.core.handlers.base")
    if handlers is None:
        return False  # no request handler was ever imported: no request runs
    handling = handlers.BaseHandler.get_response.__code__
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is handling:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def scope(config: CacheConfig) -> LeaseScope:
    """The scope of the running unit of work for ``config``'s cache."""
    unit = _unit(create=True)
    assert unit is not None
    return unit.scope(config)


def holds(config: CacheConfig, key: str) -> bool:
    """Whether the running unit holds the lease on ``key``."""
    unit = _unit(create=False)
    held = None if unit is None else unit.scopes.get(config)
    return held is not None and held.holds(sync_core(config), key)


def holdings(config: CacheConfig) -> dict[str, tuple[str, Lease]]:
    """The leases the running unit has for ``config``'s cache, by key: those
    it holds (``"held"``), and those of header lists whose commit waits for
    their page (``"deferred"``). Creates no unit: for the record of a
    request's calls (``_recording``)."""
    unit = _unit(create=False)
    if unit is None:
        return {}
    found = {lease.key: ("deferred", lease) for owner, lease, *_ in unit.deferred if owner == config}
    held = unit.scopes.get(config)
    if held is not None:
        found.update((lease.key, ("held", lease)) for lease in held.leases())
    return found


def take(config: CacheConfig, key: str) -> Lease | None:
    """Remove and return the running unit's lease on ``key``, if any: for the
    write that settles it."""
    unit = _unit(create=False)
    if unit is None:
        return None
    held = unit.scopes.get(config)
    return None if held is None else held.take(sync_core(config), key)


def forget_all(config: CacheConfig) -> list[Lease]:
    """Remove and return the running unit's leases for ``config`` and forget
    its deferred writes (the cache's ``clear()``)."""
    unit = _unit(create=False)
    if unit is None:
        return []
    unit.deferred = [item for item in unit.deferred if item[0] != config]
    held = unit.scopes.pop(config, None)
    if held is None:
        return []
    core = sync_core(config)
    return [lease for lease in held.leases() if held.take(core, lease.key) is not None]


def defer(config: CacheConfig, lease: Lease, value: Any, ttl: int | None, stale_ttl: float) -> None:
    unit = _unit(create=True)
    assert unit is not None
    unit.deferred.append((config, lease, value, ttl, stale_ttl))


def take_deferred(config: CacheConfig) -> list[tuple[Lease, Any, int | None, float]]:
    unit = _unit(create=False)
    if unit is None or not unit.deferred:
        return []
    mine = [
        (lease, value, ttl, stale) for owner, lease, value, ttl, stale in unit.deferred if owner == config
    ]
    unit.deferred = [item for item in unit.deferred if item[0] != config]
    return mine


def begin_request(**kwargs: Any) -> None:
    """``request_started`` receiver: a fresh unit of work for the request.

    Under ASGI it is kept under the request's ``ThreadSensitiveContext``
    (this receiver runs in a task and a thread of its own there, so a
    context variable set here would be lost); under WSGI in the request's
    own context."""
    global _requests_seen
    _requests_seen = True
    request = _asgi_request()
    if request is not None:
        with _by_request_lock:
            _by_request[request] = _Unit(owned=False)
    else:
        _current.set(_Unit(owned=False))


def fail_request(**kwargs: Any) -> None:
    """``got_request_exception`` receiver: the request's view raised."""
    unit = _unit(create=False)
    if unit is not None:
        unit.failed = True


def end_request(**kwargs: Any) -> None:
    """``request_finished`` receiver: settle the request (see :func:`_settling`)."""
    request = _asgi_request()
    if request is not None:
        # Left in place, ended, until the request's context goes: a task the
        # request started and left running must not find a unit to renew.
        unit = _by_request.get(request)
    else:
        unit = _current.get()
        if unit is None:
            return
        if unit.thread is not None and (unit.thread != threading.get_ident() or unit.ended):
            return  # not this request's: its thread or task settles it
        # A unit of this thread's own, found at a request's end: the request
        # made it, before this module's receivers were connected (the cache
        # was first used in the request's view, as when nothing touches it
        # at start-up); begin_request would have made a request's otherwise.
        _current.set(None)  # nothing copied from this context later sees the ended request
    if unit is not None:
        _settle(unit)


def _settling(unit: _Unit) -> Iterator[tuple[CacheConfig, methodcaller]]:
    """The core calls that settle ``unit``, each with its cache: store the
    header lists still waiting for their page, then give back the leases of
    reads the unit never followed with a write (its view chose not to cache,
    or never meant to: a flag that is normally absent), so that waiters go
    on at once and later reads of a key found missing miss at once (see
    ``stampede.LeaseScope``)."""
    unit.ended = True
    deferred, unit.deferred = unit.deferred, []
    scopes, unit.scopes = unit.scopes, {}
    for config, lease, value, ttl, stale_ttl in deferred:
        yield config, methodcaller("commit", lease, value, ttl=ttl, stale_ttl=stale_ttl, store_if_lapsed=True)
    for config, held in scopes.items():
        held.failed = held.failed or unit.failed
        yield config, methodcaller("settle", held)


def _settle(unit: _Unit) -> None:
    for config, call in _settling(unit):
        try:
            call(sync_core(config))
        except Exception as exc:  # the others still settle; these lapse within LEASE_TTL
            _settle_failed(exc)


async def _asettle(unit: _Unit) -> None:
    for config, call in _settling(unit):
        try:
            await call(async_core(config))
        except Exception as exc:
            _settle_failed(exc)


def _settle_failed(error: Exception) -> None:
    logger.warning("could not settle a lease at the end of its unit of work: %s", error)


def lease_scope() -> UnitOfWork:
    """A unit of work outside a request (a Celery task, a management
    command, a job), for every ``StampedeCache``: ``with lease_scope():`` or
    ``async with lease_scope():`` around it.

    Inside, a ``get`` that misses holds the key's lease for the block, renewed
    while it runs (up to ``MAX_LEASE_TIME``), and the block's ``set`` of the
    key stores under it; leaving the block gives back the leases of keys it
    read and never wrote, waking their waiters at once (a block that raised
    gives them back plainly). Inside a request, the request is the unit of
    work already, and this block makes a unit of its own within it.
    """
    return UnitOfWork()


class UnitOfWork:
    """What :func:`lease_scope` returns: a context manager, sync or async, entered once."""

    def __init__(self) -> None:
        self._unit: _Unit | None = None
        self._token: Token[_Unit | None] | None = None

    def _enter(self) -> None:
        if self._unit is not None:
            raise RuntimeError("a django_stampede.lease_scope() is entered once: make another")
        self._unit = _Unit(owned=False, block=True)
        self._token = _current.set(self._unit)

    def _exit(self, failed: bool) -> _Unit:
        unit, token = self._unit, self._token
        assert unit is not None
        assert token is not None
        unit.failed = failed
        _current.reset(token)
        return unit

    def __enter__(self) -> UnitOfWork:
        self._enter()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        _settle(self._exit(error is not None))

    async def __aenter__(self) -> UnitOfWork:
        self._enter()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await _asettle(self._exit(error is not None))
