"""Both drivers behind one blocking interface, so one suite tests both.

``AsyncDriver`` runs a ``stampede.asyncio.Stampede`` on an event loop in a
thread of its own; calls from many test threads become concurrent tasks on
that loop, which is what the asyncio driver's coalescing must handle.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import redis
import redis.asyncio

import stampede
import stampede.asyncio

T = TypeVar("T")


class SyncDriver:
    name = "sync"

    def __init__(self, url: str, *, redis_options: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.client = redis.Redis.from_url(
            url, **{"socket_timeout": 5, "socket_connect_timeout": 5, **(redis_options or {})}
        )
        self.sf = stampede.Stampede(self.client, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sf, name)

    def close(self) -> None:
        self.sf.close()
        self.client.close()


class AsyncDriver:
    name = "asyncio"

    def __init__(self, url: str, *, redis_options: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self._thread.start()

        async def build() -> stampede.asyncio.Stampede:
            client = redis.asyncio.Redis.from_url(
                url, **{"socket_timeout": 5, "socket_connect_timeout": 5, **(redis_options or {})}
            )
            return stampede.asyncio.Stampede(client, **kwargs)

        self.sf = self.run(build())
        self.client = self.sf.client

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.sf, name)
        if not callable(method):
            return method  # type: ignore[no-any-return]
        return lambda *args, **kwargs: self.run(method(*args, **kwargs))

    def close(self) -> None:
        async def shutdown() -> None:
            await self.sf.aclose()
            await self.sf.client.aclose()
            # As asyncio.run() ends: what is left (a listener still closing
            # its connection) is cancelled and awaited, not destroyed unclosed.
            left = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)

        self.run(shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


DRIVERS = {"sync": SyncDriver, "asyncio": AsyncDriver}
