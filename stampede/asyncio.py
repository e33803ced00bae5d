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
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Generator, Hashable
from typing import Any, TypeVar, cast

import redis.asyncio
import redis.exceptions

from ._aoperations import AsyncOperations
from ._asubscriber import async_subscriber_for, close_sockets
from ._base import LEASE_TAKEN, UNSET, Lease, Paused, Read, lost_connection
from ._cached import CachedFunction, key_builder
from ._envelope import Entry
from ._events import logger
from ._exceptions import ConfigurationError, RedisUnavailableError
from ._flights import Flight, Flights, Turns
from ._flow import (
    RELEASE_GRACE,
    Commit,
    Flow,
    Lookup,
    Op,
    Rebuild,
    Rebuilt,
    Release,
    Reread,
    Sleep,
    Standby,
    Wait,
    Waited,
    renew_interval,
    wake_interval,
)
from ._keys import Keys
from ._options import Options
from ._urls import connect, split_options

__all__ = ["Stampede", "for_running_loop", "redis_client"]

T = TypeVar("T")

Rebuilder = Callable[[], "Awaitable[T] | T"]


class _Detached(BaseException):
    """Internal: a caller was cancelled while its rebuild runs on in a thread;
    ``outcome`` completes with that rebuild's :class:`Rebuilt`."""

    def __init__(self, outcome: asyncio.Future[Rebuilt]) -> None:
        super().__init__()
        self.outcome = outcome


class _ReadAbandoned(Exception):
    """Internal: the task sending a shared GET was cancelled before its reply."""


class _PendingRead:
    """A GET, whose reply the tasks that came before it was sent share
    (see :class:`stampede._sync._SharedRead`): ``next`` gathers the tasks
    that come while it is in flight. ``reply`` is made by the first task
    that waits on it, so a read that nobody joins (a hit, most of the time)
    makes no future."""

    __slots__ = ("next", "reply")

    def __init__(self) -> None:
        self.reply: asyncio.Future[bytes | None] | None = None
        self.next: _PendingRead | None = None

    def finished(self) -> asyncio.Future[bytes | None]:
        if self.reply is None:
            self.reply = asyncio.get_running_loop().create_future()
        return self.reply


class Stampede(AsyncOperations):
    """Stampede-protected caching on a ``redis.asyncio`` client.

    Takes the same arguments as :class:`stampede.Stampede`, except
    ``background_workers``: background refreshes run as tasks of the running
    event loop. A caller cancelled while its plain (non-async) rebuild
    function runs in a thread gets its cancellation at once; the thread's
    result is still committed under the lease, which is released after it.
    """

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self._flights: Flights[asyncio.Event] = Flights(asyncio.Event)
        self._turns = Turns(asyncio.Lock)
        self._tasks: set[asyncio.Task[None]] = set()
        self._subscriber = async_subscriber_for(client)
        self._near = self._near_store()
        if self._near is not None:
            self._subscriber.track(self._near)
        self._reads: dict[bytes, _PendingRead] = {}

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        socket_timeout: float = 5.0,
        socket_connect_timeout: float = 5.0,
        cluster: bool = False,
        **kwargs: Any,
    ) -> Stampede:
        """Connect to the Redis at ``url``; see :meth:`stampede.Stampede.from_url`."""
        redis_options, kwargs = split_options(cls, url, kwargs, asynchronous=True, cluster=cluster)
        client, owned = connect(
            url,
            asynchronous=True,
            cluster=cluster,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            **{"health_check_interval": 30, **redis_options},
        )
        instance = cls(client, **kwargs)
        instance._owns_client = True
        instance._owned = owned
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
        lookup = await self._first_read(keys, options)
        if isinstance(lookup, Entry):
            return cast(T, lookup.value)
        return await self._single_flight(keys, options, lookup, rebuild)  # type: ignore[no-any-return]

    async def _first_read(self, keys: Keys, options: Options) -> Entry | Lookup:
        """The hit (the fresh :class:`Entry` to serve), or what the flow needs."""
        near = self._near
        if near is not None:
            if not near.live:
                self._subscriber.revive()
            elif self._subscriber.quiet() or await self._subscriber.settled():
                raw = near.get(keys.value)
                if raw is not None:
                    near_found = self._near_lookup(keys, raw, options)
                    if near_found is not None:
                        return near_found
        try:
            raw = await self._shared_get(keys.value)
        except redis.exceptions.RedisError as exc:
            return self._read_failed(keys, exc)
        return self._lookup(keys, raw, options)

    async def _shared_get(self, name: bytes) -> bytes | None:
        """GET ``name``, sharing the reply with the tasks that ask meanwhile
        (see :meth:`stampede.Stampede._shared_get`)."""
        reads = self._reads
        while (pending := reads.get(name)) is not None:
            batch = pending.next
            if batch is None:
                # The first to come while a read is in flight waits for it,
                # then sends the read of those who came meanwhile.
                batch = pending.next = _PendingRead()
                try:
                    await asyncio.wait([done := pending.finished()])
                except BaseException:
                    if pending.next is batch:
                        pending.next = None
                    if batch.reply is not None:
                        batch.reply.set_exception(_ReadAbandoned())
                        batch.reply.exception()  # retrieved: its waiters may all have gone
                    raise
                failed = done.exception()
                if isinstance(failed, redis.exceptions.RedisError):
                    # Redis failed after they asked: theirs to know, without one
                    # more GET to a server that is failing (a failover).
                    if batch.reply is not None:
                        batch.reply.set_exception(failed)
                        batch.reply.exception()  # retrieved: its waiters may all have gone
                    raise failed
                return await self._send_read(name, batch)
            try:
                return await asyncio.shield(batch.finished())
            except _ReadAbandoned:
                # Its sender was cancelled: read again, sharing the reads of
                # those who were waiting too (one read each would empty the pool).
                continue
        return await self._send_read(name, _PendingRead())

    async def _send_read(self, name: bytes, read: _PendingRead) -> bytes | None:
        reads = self._reads
        reads[name] = read
        near = self._near
        token = near.begin_fill(name) if near is not None else None  # before the GET is sent
        raw = None
        try:
            try:
                raw = await self._reader().get(name)
            except AttributeError as exc:
                lost = lost_connection(exc)
                if lost is None:
                    raise
                raise lost from exc
        except BaseException as exc:
            if read.reply is not None:
                error = exc if isinstance(exc, redis.exceptions.RedisError) else _ReadAbandoned()
                read.reply.set_exception(error)
                read.reply.exception()  # retrieved: its waiters may all have gone
            raise
        else:
            if read.reply is not None:
                read.reply.set_result(raw)
        finally:
            if near is not None:  # keeps the value, or (after an error) just drops the token
                near.end_fill(name, token, raw)
            if reads.get(name) is read:
                del reads[name]
        return raw  # type: ignore[no-any-return]

    async def _single_flight(
        self, keys: Keys, options: Options, lookup: Lookup, rebuild: Rebuilder[Any]
    ) -> Any:
        missed = False  # whether this call was reported as a miss
        while True:
            flight, leader = self._flights.join(keys.value)
            if leader:
                break
            late = flight.overtaken  # joined after a write of this process: read again after it
            if lookup.entry is not None:
                return self._serve_follower(keys, lookup.entry)
            missed = self._miss_once(keys, missed)
            started = self._clock.monotonic()
            try:
                await asyncio.wait_for(flight.done.wait(), options.wait_timeout)
            except asyncio.TimeoutError:
                return await self._after_wait_timeout(keys, options, rebuild)
            self._waited(keys, started)
            if flight.superseded or late:
                again = await self._first_read(keys, options)  # what the newer write left
                if isinstance(again, Entry):
                    return again.value
                lookup = again
            elif not flight.abandoned:
                return flight.outcome()
        if options.background and lookup.entry is not None:
            self._refresh_in_background(keys, options, lookup, rebuild, flight)
            return self._serve_follower(keys, lookup.entry)
        flow = self._flow(keys, options, missed=missed)
        return await self._lead(keys.value, flight, flow, flow.run(lookup), keys, options, rebuild)

    async def _after_wait_timeout(self, keys: Keys, options: Options, rebuild: Rebuilder[Any]) -> Any:
        # Tasks that gave up on this process's own flight share one fallback,
        # so a slow rebuild is not joined by one more per task.
        fallback_key = (keys.value, "after-wait")
        while True:
            flight, leader = self._flights.join(fallback_key)
            if leader:
                break
            await flight.done.wait()  # bounded as a rebuild of its own would be
            if not flight.abandoned:
                return flight.outcome()
        flow = self._flow(keys, options)
        return await self._lead(fallback_key, flight, flow, flow.after_wait_timeout(), keys, options, rebuild)

    async def _lead(
        self,
        flight_key: Hashable,
        flight: Flight[asyncio.Event],
        flow: Flow,
        steps: Generator[Op, Any, Any],
        keys: Keys,
        options: Options,
        rebuild: Rebuilder[Any],
    ) -> Any:
        try:
            value = await self._drive(steps, keys, options, rebuild)
        except BaseException as exc:
            self._flights.finish(flight_key, flight, error=exc)
            raise
        self._flights.finish(flight_key, flight, value=value, superseded=flow.superseded)
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
            flow = self._flow(keys, options, background=True)
            try:
                value = await self._drive(flow.run(lookup), keys, options, rebuild)
            except BaseException as exc:
                logger.warning("background refresh of %r failed", keys.name, exc_info=exc)
                self._flights.finish(keys.value, flight, error=exc)
                if not isinstance(exc, Exception):
                    raise
            else:
                self._flights.finish(keys.value, flight, value=value, superseded=flow.superseded)

        self._detach(refresh(), f"stampede-refresh {keys.name}")

    def _detach(self, work: Coroutine[Any, Any, None], name: str) -> None:
        # Keep a reference: the loop holds tasks only weakly.
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drive(
        self,
        flow: Generator[Op, Any, Any],
        keys: Keys,
        options: Options,
        rebuild: Rebuilder[Any] | None,
        reply: Any = None,
    ) -> Any:
        """See :meth:`stampede.Stampede._drive`."""
        failure: BaseException | None = None
        while True:
            try:
                op = flow.throw(failure) if failure is not None else flow.send(reply)
            except StopIteration as stop:
                return stop.value
            if rebuild is None and isinstance(op, Rebuild):
                flow.close()
                return Paused(op.token, op.stale)
            reply, failure = None, None
            try:
                reply = await self._execute(op, keys, options, rebuild)
            except _Detached as detached:
                # The rest of this flow (commit, release) belongs to the
                # rebuild still running; the cancelled caller leaves now.
                self._detach(self._finish_detached(flow, detached, keys, options, rebuild), "stampede-finish")
                raise asyncio.CancelledError from None
            except BaseException as exc:  # includes cancellation: the flow cleans up
                failure = exc

    async def _finish_detached(
        self,
        flow: Generator[Op, Any, Any],
        detached: _Detached,
        keys: Keys,
        options: Options,
        rebuild: Rebuilder[Any] | None,
    ) -> None:
        try:
            await self._drive(flow, keys, options, rebuild, await detached.outcome)
        except Exception as exc:  # nobody is left to receive it
            logger.warning("rebuild of %r outlived its cancelled caller and failed", keys.name, exc_info=exc)

    async def _execute(self, op: Op, keys: Keys, options: Options, rebuild: Rebuilder[Any] | None) -> Any:
        if isinstance(op, Rebuild):
            assert rebuild is not None  # _drive pauses at a Rebuild when there is none
            return await self._rebuild(op.token, keys, options, rebuild)
        if isinstance(op, Wait):
            return await self._wait(op, keys)
        if isinstance(op, Sleep):
            await asyncio.sleep(op.seconds)
            return None
        if isinstance(op, Standby):
            return await self._standby_get(keys)
        if isinstance(op, Reread):
            return await self._reread(keys)
        script, args = self._op_call(op, keys, options)
        if isinstance(op, Release) and op.detached:
            self._detach(self._release_until_answered(keys, args, options), "stampede-release")
            return None
        if isinstance(op, Release):
            # Shielded: a caller cancelled mid-release still frees the lease.
            try:
                await asyncio.shield(self._script(script, keys, args))
            except RedisUnavailableError:
                pass  # logged as an event already; the lease TTL cleans up
            return None
        call: Awaitable[Any] = self._script(script, keys, args)
        if isinstance(op, Commit):
            call = asyncio.shield(call)  # a cancelled caller's value still lands, freeing the lease
        return self._op_result(op, await call)

    async def _release_until_answered(self, keys: Keys, args: list[Any], options: Options) -> None:
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + options.lease_ttl  # it has expired by then anyway
        delay = 0.1
        while True:
            try:
                await self._script("release", keys, args)
                return
            except RedisUnavailableError:
                if loop.time() + delay >= give_up_at:
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _pause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def _script(self, name: str, keys: Keys, args: list[Any]) -> Any:
        try:
            with self._redis_errors(keys.name, name):
                if self._sharded is None:
                    await self._ask_sharded()
                return await self._scripts_now()[name](keys=keys.script_keys, args=args)
        finally:
            self._wrote(name, keys)

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
        if inspect.iscoroutinefunction(rebuild):
            # Cancelling the caller cancels the coroutine; the flow then frees the lease.
            return await self._run_rebuild(rebuild(), watchdog)
        outcome = asyncio.ensure_future(self._run_rebuild(self._in_thread(rebuild), watchdog))
        try:
            return await asyncio.shield(outcome)
        except asyncio.CancelledError:
            # A thread cannot be stopped. Freeing the lease now would let a
            # second rebuild start beside it; let it finish and commit instead.
            raise _Detached(outcome) from None

    async def _run_rebuild(self, call: Awaitable[Any], watchdog: asyncio.Task[bool] | None) -> Rebuilt:
        started = self._clock.monotonic()
        value: Any = None
        error: BaseException | None = None
        try:
            value = await call
        except BaseException as exc:
            error = exc
        duration = self._clock.monotonic() - started
        lost = False
        if watchdog is not None:
            if watchdog.done() and not watchdog.cancelled() and watchdog.exception() is None:
                lost = watchdog.result()
            watchdog.cancel()
        return Rebuilt(value, error, duration, lost)

    @staticmethod
    async def _in_thread(rebuild: Rebuilder[Any]) -> Any:
        value = await asyncio.to_thread(rebuild)
        if inspect.isawaitable(value):  # a plain callable that returned a coroutine
            value = await value
        return value

    async def _wait(self, op: Wait, keys: Keys) -> Waited:
        # See stampede.Stampede._wait: one subscriber per loop and client.
        clock = self._clock
        deadline = clock.monotonic() + op.timeout
        subscriber = self._subscriber
        watch = subscriber.watch(keys.channel)
        try:
            with self._redis_errors(keys.name, "wait for the rebuild"):
                pttl = op.lease_pttl
                while True:
                    remaining = deadline - clock.monotonic()
                    if remaining <= 0:
                        return Waited()
                    await watch.wait(wake_interval(remaining, pttl, watch.live))
                    watch.event.clear()  # before the probe: news after it wakes us again
                    raw, pttl = await self._scripts["probe"](keys=[keys.value, keys.lease])
                    if raw is not None and raw != op.unusable:
                        return Waited(raw)
                    if pttl == -2:
                        if not watch.released and watch.live:
                            await watch.wait(RELEASE_GRACE)
                        return Waited(None, watch.released)
        finally:
            subscriber.unwatch(watch)

    # --- a lease handed to the caller ---------------------------------------

    async def read(
        self,
        key: str | bytes,
        *,
        ttl: float | None = UNSET,
        stale_ttl: float = UNSET,
        lease_ttl: float = UNSET,
        wait_timeout: float = UNSET,
        beta: float | None = UNSET,
    ) -> Read:
        """See :meth:`stampede.Stampede.read`."""
        options = self._call_options(ttl, stale_ttl, lease_ttl, wait_timeout, UNSET, beta)
        keys = self._keys(key)
        lookup = await self._first_read(keys, options)
        if isinstance(lookup, Entry):
            return Read(True, lookup.value)
        flight_key = (keys.value, "read")
        deadline = self._clock.monotonic() + options.wait_timeout
        missed = False  # whether this call was reported as a miss
        while True:
            flight, leader = self._flights.join(flight_key)
            if leader:
                break
            late = flight.overtaken  # joined after a write of this process: its outcome may be older
            if lookup.entry is not None:
                return Read(True, self._serve_follower(keys, lookup.entry))
            missed = self._miss_once(keys, missed)
            started = self._clock.monotonic()
            remaining = deadline - started
            try:
                if remaining <= 0:
                    raise asyncio.TimeoutError
                await asyncio.wait_for(flight.done.wait(), remaining)
            except asyncio.TimeoutError:
                return self._read_timed_out(keys, options)
            self._waited(keys, started)
            if flight.abandoned or late:
                continue
            shared = flight.outcome()
            if shared is not LEASE_TAKEN:
                return shared  # type: ignore[no-any-return]
            # A task of this loop rebuilds under the lease: the next flight
            # waits for its commit.
        try:
            flow = self._flow(keys, options, take_over=False, deadline=deadline, missed=missed)
            outcome = await self._drive(flow.run(lookup), keys, options, None)
            read = self._lease_for(keys, options, flow, outcome) if isinstance(outcome, Paused) else None
        except BaseException as exc:
            self._flights.finish(flight_key, flight, error=exc)
            raise
        if read is None:
            read = Read(True, outcome)
        self._flights.finish(flight_key, flight, value=LEASE_TAKEN if read.lease is not None else read)
        return read

    async def commit(
        self,
        lease: Lease,
        value: Any,
        *,
        ttl: float | None = UNSET,
        stale_ttl: float = UNSET,
        store_if_lapsed: bool = False,
    ) -> bool:
        """See :meth:`stampede.Stampede.commit`."""
        rebuilt = self._rebuilt_by_holder(lease, value)
        options = self._settle_options(lease, ttl, stale_ttl)
        flow = lease._flow
        _, error = await self._drive(
            flow.settle(lease.token, rebuilt, None, lease._won_at if store_if_lapsed else None),
            lease.keys,
            options,
            None,
        )
        if error is not None:
            raise error
        return flow.committed

    async def release(self, lease: Lease) -> None:
        """See :meth:`stampede.Stampede.release`."""
        self._rebuilt_by_holder(lease, None)  # validates the argument
        await self._execute(Release(lease.token), lease.keys, lease._options, None)

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

    async def __aenter__(self) -> Stampede:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Wait for background refreshes to finish; close the client too if
        :meth:`from_url` created it."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._near is not None:
            self._subscriber.untrack(self._near)
        await self._subscriber.aclose()
        standbys = list(self._standby.values())
        self._standby.clear()
        for standby in standbys:
            await standby.aclose()
        if self._owns_client:
            await self._client.aclose()
            for owned in self._owned:
                await owned.aclose()


# --- one instance per event loop -------------------------------------------------

_per_loop_lock = threading.Lock()
_per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, Stampede]] = (
    weakref.WeakKeyDictionary()
)


def for_running_loop(key: Hashable, factory: Callable[[], Stampede]) -> Stampede:
    """The instance made by ``factory`` for ``key`` on the running event loop.

    ``redis.asyncio`` connections belong to one loop, so frameworks that run
    async code on several loops (a loop per request under WSGI, a loop per
    thread) need one instance per loop. Instances of loops that have since
    closed are dropped and their sockets closed, so short-lived loops leave
    nothing behind.
    """
    loop = asyncio.get_running_loop()
    with _per_loop_lock:
        for closed in [other for other in _per_loop if other.is_closed()]:
            for instance in _per_loop.pop(closed).values():
                _abandon(instance)
        instances = _per_loop.setdefault(loop, {})
        if key not in instances:
            instances[key] = factory()
        return instances[key]


def _abandon(instance: Stampede) -> None:
    """Close the sockets of an instance whose loop is closed (so cannot be awaited)."""
    close_sockets(instance._subscriber.connections())  # its own node clients' too
    for client in _clients_of(instance):
        pool = getattr(client, "connection_pool", None)
        if pool is not None:
            connections = [*pool._available_connections, *pool._in_use_connections]
        else:  # a cluster client: a few connections per node, the first it asked included
            manager = client.nodes_manager
            nodes = {id(node): node for node in (*manager.startup_nodes.values(), *client.get_nodes())}
            connections = [c for node in nodes.values() for c in getattr(node, "_connections", ())]
            client._initialize = True  # what its aclose() records: it is closed, not leaked
        close_sockets(connections)


def _clients_of(instance: Stampede) -> list[Any]:
    """Every client an instance talks through: its own, its replicas, and the
    Sentinels a Sentinel-managed pool asks."""
    clients = [instance.client, *instance.replicas, *instance._standby.values()]
    for client in list(clients):
        manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
        clients.extend(getattr(manager, "sentinels", ()))
    return clients


def redis_client(url: str, *, cluster: bool = False, **options: Any) -> Any:
    """A redis-py client for ``url``: one server (``redis://``, ``rediss://``,
    ``unix://``), a Redis Cluster (``redis+cluster://``, or ``cluster=True``) or
    the master of a Sentinel-watched service (``redis+sentinel://``); see
    :meth:`Stampede.from_url`. ``options`` go to redis-py (``socket_timeout``
    and the like). For integrations that build their own client; a bad URL is
    a :class:`~stampede.ConfigurationError` naming it.
    """
    return connect(url, asynchronous=True, cluster=cluster, **options)[0]
