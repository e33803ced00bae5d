"""How the backend's methods are written: each once, as a plan.

A plan is a generator that builds the key, converts the timeout, takes or
keeps the request's lease, and turns the core's replies into Django's
return value. It yields each call it needs of the core (``call("read",
key)``) and receives the reply: the sync method runs the plan with the
blocking core (:meth:`PlannedCache._run`), its ``a`` twin with the asyncio
core (:meth:`PlannedCache._arun`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator
from operator import methodcaller
from typing import Any, TypeAlias, TypeVar

from django.core.cache.backends.base import BaseCache

from stampede import Stampede

from ._config import CacheConfig
from ._registry import async_core

__all__ = ["Plan", "PlannedCache", "call", "computed"]

_T = TypeVar("_T")
#: A call of the backend: yields the core calls it needs, receives their
#: replies, and returns what the backend method returns.
Plan: TypeAlias = Generator[Callable[[Any], Any], Any, _T]


def call(method: str, *args: Any, **kwargs: Any) -> methodcaller:
    """The step of a plan that calls ``method`` of the core with these arguments."""
    return methodcaller(method, *args, **kwargs)


def computed(function: Callable[..., Any], *args: Any) -> Callable[[Any], Any]:
    """The step of a plan that calls the user's ``function`` (awaited by ``_arun``
    if it returns an awaitable: an ``a*`` method's coroutine function)."""
    return lambda core: function(*args)


class PlannedCache(BaseCache):
    """What every part of the backend builds on: its settings, its blocking
    core, and the two ways to run a plan."""

    _config: CacheConfig
    _core: Stampede

    def _run(self, plan: Plan[_T]) -> _T:
        """Run ``plan`` against the blocking core and return its result."""
        core = self._core
        try:
            step = next(plan)
            while True:
                try:
                    reply = step(core)
                except BaseException as exc:  # the plan sees the core's error at its call
                    step = plan.throw(exc)
                else:
                    step = plan.send(reply)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    async def _arun(self, plan: Plan[_T]) -> _T:
        """Run ``plan`` against the asyncio core of the running loop and return its result."""
        try:
            step = next(plan)
            core = async_core(self._config)  # looked up at the plan's first call: some make none
            while True:
                try:
                    reply = step(core)
                    if inspect.isawaitable(reply):  # the core's always; a user's function's maybe
                        reply = await reply
                except BaseException as exc:  # cancellation too: the plan sees it at its call
                    step = plan.throw(exc)
                else:
                    step = plan.send(reply)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    def _on_key(self, method: str, key: Any, version: int | None) -> Plan[bool]:
        """The core's ``method`` (``has_key``, ``invalidate``) called on ``key``."""
        answer: bool = yield call(method, self.make_and_validate_key(key, version=version))
        return answer
