"""The record of what a request's cache calls did: each call of a cache's
method (its cache, method, keys, time taken), the events its core reported
meanwhile (a hit, a stale hit, a lease won, a wait and its duration, a
fail-open...) and the leases the request held before and after it. The
debug toolbar panel shows it; the cache header middleware reads it.

Recording has two switches, both needed:

- ``OPTIONS["RECORD_CALLS"] = True`` on a cache: its methods are wrapped and
  its core reports events to ``_recording_hook.on_event``. A setting rather than the
  panel turning it on because the core's event hook is fixed when the core
  is built (at the cache's first use, shared by every cache of the same
  settings, before any panel has loaded), and because a hook makes every
  call, hits included, build and hand over an event. A cache without the
  setting is not touched: no wrapper, no hook, its hits as cheap as ever.
- a :func:`recording` block around the request (the panel's and the
  middleware's): outside one, a wrapped method costs a context variable
  lookup, and the events go nowhere.

Events reach the call under way through a context variable: the blocking
core reports on the caller's thread, the asyncio core in the caller's task,
and the threads and tasks a request's code starts with its context (Django's
``sync_to_async``, ``asyncio`` tasks) record into the same request.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from django.core.cache import caches

from stampede import Event

from . import _leases as leases
from ._config import CacheConfig
from ._recording_hook import collected

__all__ = ["METHODS", "Call", "Recorder", "alias_of", "instrument", "recording"]

#: The methods of a cache that record, besides their ``a`` twins: every one
#: that reads or writes.
_SYNC_METHODS = (
    *("get", "get_many", "has_key", "ttl", "get_or_set", "get_or_set_many"),
    *("set", "add", "touch", "delete", "set_many", "delete_many", "incr", "decr"),
    *("incr_version", "decr_version", "clear"),
    *("invalidate", "invalidate_tags", "delete_tags", "invalidate_all"),
)
METHODS = (*_SYNC_METHODS, *(f"a{name}" for name in _SYNC_METHODS))

#: The request's leases on a cache, by name: whether each is held or (a header
#: list's) committed after its page, and whether it was granted without Redis.
Holdings = dict[str, tuple[str, bool]]


@dataclass(eq=False)
class Call:
    """One call of a cache's method, and what happened in it."""

    number: int  #: 1, 2... in the order the calls started
    depth: int  #: 0: called by the request's code; 1: from inside a call (a ``get_or_set`` function)...
    alias: str  #: the cache's alias in ``CACHES``
    config: CacheConfig
    method: str
    keys: tuple[str, ...]  #: as the caller gave them; for the tag calls, the tags
    names: dict[str, str]  #: each key's name in Redis, to the key as given
    before: Holdings  #: the request's leases on this cache when the call started, by name
    started: float = field(default_factory=time.perf_counter)
    duration: float = 0.0  #: seconds
    events: list[Event] = field(default_factory=list)
    result: Any = None
    error: BaseException | None = None
    after: Holdings = field(default_factory=dict)  #: ... and when it ended

    def given(self, name: str) -> str:
        """The key as the caller gave it, for its name in Redis (``name`` itself if unknown)."""
        return self.names.get(name, name)


class Recorder:
    """The calls of one request (or of any :func:`recording` block), in the order they started."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()  # a request's threads may call at once

    def begin(self, cache: Any, alias: str, method: str, arguments: dict[str, Any]) -> Call:
        keys, names = _keys_of(cache, method, arguments)
        parent = _open.get()
        config: CacheConfig = cache._config
        call = Call(
            number=0,
            depth=0 if parent is None else parent.depth + 1,
            alias=alias,
            config=config,
            method=method,
            keys=keys,
            names=names,
            before=_holdings(config),
        )
        with self._lock:
            call.number = next(self._numbers)
            self.calls.append(call)
        return call

    def end(self, call: Call) -> None:
        call.duration = time.perf_counter() - call.started
        call.after = _holdings(call.config)

    def holdings(self) -> dict[CacheConfig, Holdings]:
        """The leases the request holds now, for each cache it called."""
        with self._lock:
            configs = {call.config for call in self.calls}
        return {config: _holdings(config) for config in configs}


def _holdings(config: CacheConfig) -> Holdings:
    for _ in range(3):
        try:
            found = leases.holdings(config)
        except RuntimeError:  # another thread of the request took or settled a lease meanwhile
            continue
        return {name: (state, lease.without_redis) for name, (state, lease) in found.items()}
    return {}


_recorder: ContextVar[Recorder | None] = ContextVar("django_stampede_recorder", default=None)
_open: ContextVar[Call | None] = ContextVar("django_stampede_call", default=None)


@contextmanager
def recording() -> Iterator[Recorder]:
    """Record the calls of recording caches made in this context until the
    block ends; inside another recording, that one's recorder."""
    current = _recorder.get()
    if current is not None:
        yield current
        return
    recorder = Recorder()
    token = _recorder.set(recorder)
    try:
        yield recorder
    finally:
        _recorder.reset(token)


# --- the wrappers ----------------------------------------------------------------


def instrument(cache: Any, alias: str) -> None:
    """Make ``cache`` (a ``StampedeCache`` being built) record each call of its
    methods made inside a :func:`recording` block: each method is replaced,
    on this instance only, by a wrapper that looks for the block first."""
    for name in METHODS:
        method = getattr(cache, name)
        wrap = _arecorded if inspect.iscoroutinefunction(method) else _recorded
        setattr(cache, name, wrap(cache, alias, name, method))


@functools.cache
def _signature(function: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(function)


def _bound(cache: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> inspect.BoundArguments:
    bound = _signature(getattr(type(cache), name)).bind(cache, *args, **kwargs)
    if "keys" in bound.arguments:
        # Read once here and handed on as a list: an iterator the record
        # read would reach the method empty.
        bound.arguments["keys"] = list(bound.arguments["keys"])
    return bound


@contextmanager
def _under_way(
    recorder: Recorder, cache: Any, alias: str, name: str, bound: inspect.BoundArguments
) -> Iterator[Call]:
    """The record of one call while it runs: the events its core reports go
    to it, and what it returns or raises is noted on it by the caller."""
    call = recorder.begin(cache, alias, name, bound.arguments)
    token, listening = _open.set(call), collected.set(call.events)
    try:
        yield call
    except BaseException as exc:
        call.error = exc
        raise
    finally:
        collected.reset(listening)
        _open.reset(token)
        recorder.end(call)


def _recorded(cache: Any, alias: str, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        recorder = _recorder.get()
        if recorder is None:
            return method(*args, **kwargs)
        try:
            bound = _bound(cache, name, args, kwargs)
        except TypeError:
            return method(*args, **kwargs)  # which raises its own error for these arguments
        with _under_way(recorder, cache, alias, name, bound) as call:
            call.result = method(*bound.args[1:], **bound.kwargs)
            return call.result

    return recorded


def _arecorded(cache: Any, alias: str, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def recorded(*args: Any, **kwargs: Any) -> Any:
        recorder = _recorder.get()
        if recorder is None:
            return await method(*args, **kwargs)
        try:
            bound = _bound(cache, name, args, kwargs)
        except TypeError:
            return await method(*args, **kwargs)
        with _under_way(recorder, cache, alias, name, bound) as call:
            call.result = await method(*bound.args[1:], **bound.kwargs)
            return call.result

    return recorded


def _keys_of(cache: Any, method: str, arguments: dict[str, Any]) -> tuple[tuple[str, ...], dict[str, str]]:
    """The keys a call names, as given, and their names in Redis."""
    if "key" in arguments:
        given = [arguments["key"]]
    elif "keys" in arguments:
        given = list(arguments["keys"])
    elif "data" in arguments:
        given = list(arguments["data"])
    else:  # the tag calls, clear, invalidate_all
        return tuple(str(tag) for tag in arguments.get("tags", ())), {}
    version = arguments.get("version")
    names = {}
    for key in given:
        try:
            names[cache.make_key(key, version=version)] = str(key)
        except Exception:  # a KEY_FUNCTION of the user's: its error is the call's to raise
            continue
    return tuple(str(key) for key in given), names


def alias_of(location: Any, params: dict[str, Any]) -> str:
    """The alias in ``CACHES`` of the cache built with ``location`` and
    ``params`` (what Django's cache handler passes), or ``""``."""
    for alias, entry in caches.settings.items():
        rest = {name: value for name, value in entry.items() if name not in ("BACKEND", "LOCATION")}
        if entry.get("LOCATION", "") == location and rest == params:
            return str(alias)
    return ""
