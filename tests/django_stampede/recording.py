"""Cache backends that record the calls a view decorator makes: which method,
which key, which timeout, and whether a blocking call ran on an event loop's
thread (where it would hold up every request of an ASGI server)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django.core.cache.backends.locmem import LocMemCache
from django_stampede import StampedeCache


@dataclass(frozen=True)
class Call:
    cache: str  # the backend's KEY_PREFIX, to tell the aliases apart
    method: str
    key: str
    timeout: Any = None
    on_loop: bool = False


calls: list[Call] = []
# Set during a recorded call: BaseCache's async methods run the sync ones in a
# thread, and those inner calls are not the caller's.
_inside: ContextVar[bool] = ContextVar("recording_inside", default=False)


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class _Recording:
    """Records each call of ``get``, ``set`` and their async twins, then runs it."""

    key_prefix: str

    @contextmanager
    def _record(self, method: str, key: str, timeout: Any = None) -> Iterator[None]:
        if not _inside.get():
            on_loop = not method.startswith("a") and _on_loop()
            calls.append(Call(self.key_prefix, method, key, timeout, on_loop))
        token = _inside.set(True)
        try:
            yield
        finally:
            _inside.reset(token)

    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        with self._record("get", key):
            return super().get(key, default, version)  # type: ignore[misc]

    async def aget(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        with self._record("aget", key):
            return await super().aget(key, default, version)  # type: ignore[misc]

    def set(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> None:
        with self._record("set", key, timeout):
            super().set(key, value, timeout, version)  # type: ignore[misc]

    async def aset(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> None:
        with self._record("aset", key, timeout):
            await super().aset(key, value, timeout, version)  # type: ignore[misc]


class RecordingLocMemCache(_Recording, LocMemCache):
    pass


class RecordingStampedeCache(_Recording, StampedeCache):
    pass
