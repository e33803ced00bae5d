"""The asyncio driver: :class:`Stampede` on ``redis.asyncio``.

Same names and behaviour as :class:`stampede.Stampede`, as coroutines; it
runs the same :class:`~stampede._flow.Flow`. Rebuild functions may be
coroutine functions or plain callables; plain ones run in a worker thread so
that a slow rebuild never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar, cast

import redis.asyncio
import redis.exceptions

from ._base import UNSET, StampedeBase
from ._cached import CachedFunction, key_builder
from ._envelope import Entry
from ._events import logger
from ._exceptions import ConfigurationError, RedisUnavailableError
from ._flights import Flight, Flights
from ._flow import Lookup, Op, Rebuild, Rebuilt, Release, Wait, poll_interval, renew_interval
from ._keys import Keys
from ._options import Options

__all__ = ["Stampede"]

T = TypeVar("T")

Rebuilder = Callable[[], "Awaitable[T] | T"]


class Stampede(StampedeBase):
    """Stampede-protected caching on a ``redis.asyncio`` client.

    Takes the same arguments as :class:`stampede.Stampede`, except that
    background refreshes run as tasks of the running event loop.
    """

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self._flights: Flights[asyncio.Event] = Flights(asyncio.Event)
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        socket_timeout: float = 5.0,
        socket_connect_timeout: float = 5.0,
        **kwargs: Any,
    ) -> Stampede:
        """Connect to the Redis at ``url``; see :meth:`stampede.Stampede.from_url`."""
        client = redis.asyncio.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            health_check_interval=30,
        )
        instance = cls(client, **kwargs)
        instance._owns_client = True
        return instance

    async def get_or_rebuild(
        self,
        key: str | bytes,
        rebuild: Rebuilder[T],
        *,
        ttl: float | None = UNSET,
        stale_ttl: float = UNSET,
        lease_ttl: float = UNSET,
        wait_timeout: float = UNSET,
        background: bool = UNSET,
        beta: float | None = UNSET,
    ) -> T:
        """See :meth:`stampede.Stampede.get_or_rebuild`."""
        options = self._call_options(ttl, stale_ttl, lease_ttl, wait_timeout, background, beta)
        if not callable(rebuild):
            raise ConfigurationError(f"rebuild must be callable, got {rebuild!r}")
        keys = self._keys(key)
        try:
            raw = await self._client.get(keys.value)
        except redis.exceptions.RedisError as exc:
            lookup = self._read_failed(keys, exc)
        else:
            entry = self._decode(keys, raw)
            if entry is not None and self._is_hit(keys, entry, options):
                return cast(T, entry.value)
            lookup = Lookup(entry)
        return await self._single_flight(keys, options, lookup, rebuild)  # type: ignore[no-any-return]

    async def _single_flight(
        self, keys: Keys, options: Options, lookup: Lookup, rebuild: Rebuilder[Any]
    ) -> Any:
        while True:
            flight, leader = self._flights.join(keys.value)
            if leader:
                break
            if lookup.entry is not None:
                return self._serve_follower(keys, lookup.entry)
            try:
                await asyncio.wait_for(flight.done.wait(), options.wait_timeout)
            except asyncio.TimeoutError:
                return await self._drive(
                    self._flow(keys, options).after_wait_timeout(), keys, options, rebuild
                )
            if not flight.abandoned:
                return flight.outcome()
        if options.background and lookup.entry is not None:
            self._refresh_in_background(keys, options, lookup, rebuild, flight)
            return self._serve_follower(keys, lookup.entry)
        try:
            value = await self._drive(self._flow(keys, options).run(lookup), keys, options, rebuild)
        except BaseException as exc:
            self._flights.finish(keys.value, flight, error=exc)
            raise
        self._flights.finish(keys.value, flight, value=value)
        return value

    def _refresh_in_background(
        self,
        keys: Keys,
        options: Options,
        lookup: Lookup,
        rebuild: Rebuilder[Any],
        flight: Flight[asyncio.Event],
    ) -> None:
        async def refresh() -> None:
            try:
                value = await self._drive(
                    self._flow(keys, options, background=True).run(lookup), keys, options, rebuild
                )
            except BaseException as exc:
                logger.warning("background refresh of %r failed", keys.name, exc_info=exc)
                self._flights.finish(keys.value, flight, error=exc)
                if not isinstance(exc, Exception):
                    raise
            else:
                self._flights.finish(keys.value, flight, value=value)

        # Keep a reference: the loop holds tasks only weakly.
        task = asyncio.get_running_loop().create_task(refresh(), name=f"stampede-refresh {keys.name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drive(
        self, flow: Generator[Op, Any, Any], keys: Keys, options: Options, rebuild: Rebuilder[Any]
    ) -> Any:
        reply: Any = None
        failure: BaseException | None = None
        while True:
            try:
                op = flow.throw(failure) if failure is not None else flow.send(reply)
            except StopIteration as stop:
                return stop.value
            reply, failure = None, None
            try:
                reply = await self._execute(op, keys, options, rebuild)
            except BaseException as exc:  # includes cancellation: the flow cleans up
                failure = exc

    async def _execute(self, op: Op, keys: Keys, options: Options, rebuild: Rebuilder[Any]) -> Any:
        if isinstance(op, Rebuild):
            return await self._rebuild(op.token, keys, options, rebuild)
        if isinstance(op, Wait):
            return await self._wait(op, keys)
        script, args = self._op_call(op, keys, options)
        if isinstance(op, Release):
            # Shielded: a caller cancelled mid-release still frees the lease.
            try:
                await asyncio.shield(self._script(script, keys, args))
            except RedisUnavailableError:
                pass  # logged as an event already; the lease TTL cleans up
            return None
        return self._op_result(op, await self._script(script, keys, args))

    async def _script(self, name: str, keys: Keys, args: list[Any]) -> Any:
        with self._redis_errors(keys, name):
            return await self._scripts[name](keys=[keys.value, keys.lease], args=args)

    async def _renew_until_lost(self, keys: Keys, token: str, options: Options) -> bool:
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + options.max_lease_time
        while True:
            await asyncio.sleep(renew_interval(options.lease_ttl))
            if loop.time() >= give_up_at:
                logger.warning("lease on %r held for max_lease_time; no longer renewing it", keys.name)
                return False
            try:
                renewed = await self._script("extend", keys, [token, options.lease_ms])
            except RedisUnavailableError as exc:
                logger.warning("could not renew the lease on %r, will retry: %s", keys.name, exc)
                continue
            if not renewed:
                return True

    async def _rebuild(
        self, token: str | None, keys: Keys, options: Options, rebuild: Rebuilder[Any]
    ) -> Rebuilt:
        watchdog = None
        if token is not None:
            watchdog = asyncio.get_running_loop().create_task(self._renew_until_lost(keys, token, options))
        started = self._clock.monotonic()
        value: Any = None
        error: BaseException | None = None
        try:
            if inspect.iscoroutinefunction(rebuild):
                value = await rebuild()
            else:
                value = await asyncio.to_thread(rebuild)
                if inspect.isawaitable(value):
                    value = await value
        except BaseException as exc:
            error = exc
        duration = self._clock.monotonic() - started
        lost = False
        if watchdog is not None:
            if watchdog.done() and not watchdog.cancelled() and watchdog.exception() is None:
                lost = watchdog.result()
            watchdog.cancel()
        return Rebuilt(value, error, duration, lost)

    async def _wait(self, op: Wait, keys: Keys) -> bytes | None:
        deadline = self._clock.monotonic() + op.timeout
        with self._redis_errors(keys, "wait for the rebuild"):
            pubsub = self._client.pubsub()
            try:
                await pubsub.subscribe(keys.channel)
                # Probe only once subscribed: a value that lands after the
                # probe then always reaches us as a message.
                while True:
                    remaining = deadline - self._clock.monotonic()
                    if remaining <= 0:
                        return None
                    message = await pubsub.get_message(timeout=remaining)
                    if message is not None and message["type"] == "subscribe":
                        break
                while True:
                    raw, pttl = await self._scripts["probe"](keys=[keys.value, keys.lease])
                    if raw is not None and raw != op.unusable:
                        return raw  # type: ignore[no-any-return]
                    if pttl == -2:
                        return None  # freed without a (new) value: the caller may take over
                    remaining = deadline - self._clock.monotonic()
                    if remaining <= 0:
                        return None
                    await pubsub.get_message(timeout=poll_interval(remaining, pttl))
            finally:
                await asyncio.shield(pubsub.aclose())

    async def get(self, key: str | bytes) -> Entry | None:
        """See :meth:`stampede.Stampede.get`."""
        keys = self._keys(key)
        try:
            raw = await self._client.get(keys.value)
        except redis.exceptions.RedisError as exc:
            lookup = self._read_failed(keys, exc)
            if lookup.error is not None:
                raise lookup.error from exc
            return None
        return self._decode(keys, raw)

    async def set(
        self, key: str | bytes, value: Any, *, ttl: float | None = UNSET, stale_ttl: float = UNSET
    ) -> None:
        """See :meth:`stampede.Stampede.set`."""
        options = self._call_options(ttl=ttl, stale_ttl=stale_ttl)
        keys = self._keys(key)
        await self._script("write", keys, self._write_args(keys, value, options))

    async def delete(self, key: str | bytes) -> None:
        """See :meth:`stampede.Stampede.delete`."""
        keys = self._keys(key)
        await self._script("write", keys, ["", 0, keys.channel])

    async def invalidate(self, key: str | bytes) -> bool:
        """See :meth:`stampede.Stampede.invalidate`."""
        keys = self._keys(key)
        return bool(await self._script("invalidate", keys, self._invalidate_args()))

    def cached(
        self,
        *,
        ttl: float | None = UNSET,
        stale_ttl: float = UNSET,
        lease_ttl: float = UNSET,
        wait_timeout: float = UNSET,
        background: bool = UNSET,
        beta: float | None = UNSET,
        key: str | Callable[..., str] | None = None,
    ) -> Callable[[Callable[..., Any]], CachedFunction[Awaitable[Any]]]:
        """See :meth:`stampede.Stampede.cached`; the result is a coroutine function."""
        overrides: dict[str, Any] = dict(
            ttl=ttl,
            stale_ttl=stale_ttl,
            lease_ttl=lease_ttl,
            wait_timeout=wait_timeout,
            background=background,
            beta=beta,
        )
        self._call_options(**overrides)  # reject bad options when decorating

        def decorate(func: Callable[..., Any]) -> CachedFunction[Awaitable[Any]]:
            key_of = key_builder(func, key)

            @functools.wraps(func)
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                return await self.get_or_rebuild(
                    key_of(*args, **kwargs), functools.partial(func, *args, **kwargs), **overrides
                )

            return CachedFunction.attach(wrapper, key_of, self.invalidate, self.delete)

        return decorate

    async def aclose(self) -> None:
        """Wait for background refreshes to finish; close the client too if
        :meth:`from_url` created it."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._owns_client:
            await self._client.aclose()
