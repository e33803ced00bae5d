"""The driver: :class:`Stampede`, which runs the sans-IO :class:`~stampede._core.flow.Flow` on Redis.

Written once, for asyncio; the blocking twin (``stampede/_sync/stampede.py``)
is generated from this file by ``python tools/unasync.py`` (``make lint``
checks that the two agree). What differs between the flavours is in
``stampede/_primitives.py``. Under asyncio, rebuild functions may be
coroutine functions or plain callables; plain ones run in a worker thread so
that a slow rebuild never blocks the event loop.

A call reads top to bottom: :meth:`Stampede.get_or_rebuild` reads (a near
copy, else one GET shared by concurrent callers), then, on a miss, joins or
leads this process's flight for the key; the leader drives the key's flow,
carrying out each operation it yields (a script, a wait, the rebuild).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Generator, Hashable
from typing import Any, TypeVar, cast

import redis.exceptions

from .._base import LEASE_TAKEN, UNSET, Lease, Paused, Read, lost_connection
from .._core.cached import CachedFunction, key_builder
from .._core.envelope import Entry
from .._core.events import EventKind, logger
from .._core.flights import Flight, Flights, Turns
from .._core.flow import (
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
from .._core.keys import Keys
from .._core.options import Options
from .._exceptions import ConfigurationError, RedisUnavailableError
from .._primitives import (
    AsyncBackground,
    AsyncDetached,
    AsyncEvent,
    AsyncLock,
    AsyncRebuilder,
    AsyncSectionLock,
    AsyncWorker,
    async_can_block,
    async_close_client,
    async_close_subscriber,
    async_forks_with,
    async_rebuild_call,
    async_runs_in_thread,
    async_shield,
    async_sleep,
)
from .._redis.urls import connect, split_options
from .operations import AsyncOperations
from .subscriber import async_subscriber_for

__all__ = ["Stampede", "redis_client"]

T = TypeVar("T")


class _ReadAbandoned(Exception):
    """The caller sending a shared GET was cancelled before its reply."""


class _SharedRead:
    """A GET, whose reply the callers that came before it was sent share.

    ``next`` gathers the callers that come while it is in flight: they
    cannot take its reply (sent before they came, it may predate a write
    that returned since), so the first of them sends one more GET when this
    one is done, for them all. ``done`` is made by the first caller that
    waits on a read: a read that nobody joins (a hit, most of the time)
    makes no event.
    """

    __slots__ = ("done", "error", "finished", "next", "raw")

    def __init__(self) -> None:
        self.finished = False
        self.raw: bytes | None = None
        self.error: BaseException | None = None
        self.done: AsyncEvent | None = None
        self.next: _SharedRead | None = None


class Stampede(AsyncOperations):
    """Stampede-protected caching on a redis-py client.

    Args:
        client: a redis-py client (``Redis``, ``RedisCluster``, or a
            Sentinel-managed master) created with ``decode_responses=False``.
            Give it a ``socket_timeout``: without one, a Redis that stops
            answering blocks callers forever.
        namespace: prefix of every Redis key written.
        options: an :class:`~stampede.Options`; keyword arguments named like
            its fields (``ttl=60``, ``fail_open=True``...) override it.
        serializer: how values are stored; :class:`~stampede.PickleSerializer`
            by default.
        signing_key: sign every value (HMAC-SHA256 over its Redis key, header
            and payload) and read only values that verify: bytes or str of at
            least 16 bytes, or a sequence of them (signs with the first,
            accepts any: key rotation). Anything else under a key is a miss
            that is never deserialized. ``None`` (the default): unsigned.
        on_event: called with every :class:`~stampede.Event`.
        clock: time source with ``time()`` and ``monotonic()``.
        background_workers: how many background refreshes (and retried
            releases) run at once: threads of a pool for the blocking
            flavour, tasks of the running loop for asyncio.

    Under asyncio, a caller cancelled while its plain (non-async) rebuild
    function runs in a thread gets its cancellation at once; the thread's
    result is still committed under the lease, which is released after it.
    """

    def __init__(self, client: Any, *, background_workers: int = 4, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self._background = AsyncBackground(background_workers)
        self._flights: Flights[AsyncEvent] = Flights(AsyncEvent)
        self._turns = Turns(AsyncLock)
        self._subscriber = async_subscriber_for(client)
        self._near = self._near_store()
        if self._near is not None:
            self._subscriber.track(self._near)
        self._reads: dict[bytes, _SharedRead] = {}
        self._reads_lock = AsyncSectionLock()
        async_forks_with(self)

    def _forked(self) -> None:
        """In a child process just forked: what other threads had under way
        (reads, rebuilds, background refreshes) did not come along, and the
        locks they held are dropped with them."""
        self._reads = {}
        self._reads_lock = AsyncSectionLock()
        self._flights = Flights(AsyncEvent)
        self._turns = Turns(AsyncLock)
        self._background.forked()

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
        """Connect to the Redis at ``url`` (``redis://``, ``rediss://``, ``unix://``).

        A Redis Cluster: ``redis+cluster://host:port`` (or ``rediss+cluster://``),
        any node of it, or ``cluster=True``. The master of a service that
        Sentinels watch: ``redis+sentinel://host:26379[,host:port...]/service[/db]``.
        Socket timeouts are set so that an unresponsive Redis raises
        :class:`~stampede.RedisUnavailableError` instead of hanging.

        Keywords: this class's (``namespace``, ``ttl``...), or redis-py's
        connection keywords, which go to the client: TLS's ``ssl_ca_certs``,
        ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs`` (with a ``rediss://``
        URL), ``retry``, ``client_name``... Any other is a
        :class:`~stampede.ConfigurationError` naming it.
        """
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

    # --- the main entry point -----------------------------------------------

    async def get_or_rebuild(
        self,
        key: str | bytes,
        rebuild: AsyncRebuilder[T],
        *,
        ttl: float | None = UNSET,
        stale_ttl: float = UNSET,
        lease_ttl: float = UNSET,
        wait_timeout: float = UNSET,
        background: bool = UNSET,
        beta: float | None = UNSET,
    ) -> T:
        """Return the cached value of ``key``, rebuilding it with ``rebuild()``
        in exactly one caller when it is stale or missing.

        Fresh: one GET. Stale: one caller (cluster-wide) refreshes, the others
        get the stale value at once. Missing: one caller rebuilds, the others
        wait to be woken, for at most ``wait_timeout``. Options left out take
        this instance's defaults (see :class:`~stampede.Options`). Exceptions
        from ``rebuild`` reach the caller unchanged.
        """
        options = self._call_options(ttl, stale_ttl, lease_ttl, wait_timeout, background, beta)
        if not callable(rebuild):
            raise ConfigurationError(f"rebuild must be callable, got {rebuild!r}")
        keys = self._keys(key)
        # _first_read, inlined: this is every hit's path.
        if self._near is not None:
            near_found = await self._near_read(keys, options)
            if isinstance(near_found, Entry):
                return near_found.value  # type: ignore[no-any-return]
            if near_found is not None:
                return cast(T, await self._single_flight(keys, options, near_found, rebuild))
        try:
            raw = await self._shared_get(keys.value)
        except redis.exceptions.RedisError as exc:
            return cast(T, await self._single_flight(keys, options, self._read_failed(keys, exc), rebuild))
        found = self._lookup(keys, raw, options)
        if isinstance(found, Entry):
            # Not cast(): a function call, on every hit.
            return found.value  # type: ignore[no-any-return]
        return cast(T, await self._single_flight(keys, options, found, rebuild))

    async def _first_read(self, keys: Keys, options: Options) -> Entry | Lookup:
        """The hit (the fresh :class:`Entry` to serve), or what the flow needs."""
        if self._near is not None:
            near_found = await self._near_read(keys, options)
            if near_found is not None:
                return near_found
        try:
            raw = await self._shared_get(keys.value)
        except redis.exceptions.RedisError as exc:
            return self._read_failed(keys, exc)
        return self._lookup(keys, raw, options)

    async def _near_read(self, keys: Keys, options: Options) -> Entry | Lookup | None:
        """What this process's copy of ``keys`` says (see ``_near_lookup``),
        if one may be served; ``None``: read Redis."""
        near = self._near
        assert near is not None
        if not near.live:
            self._subscriber.revive()
            return None
        if not (self._subscriber.quiet() or await self._subscriber.settled()):
            return None
        raw = near.get(keys.value)
        return self._near_lookup(keys, raw, options) if raw is not None else None

    async def _shared_get(self, name: bytes) -> bytes | None:
        """GET ``name``, sharing the reply with the callers that ask meanwhile.

        A hundred callers reading one key send a GET or two, not a hundred
        (which would also empty the connection pool). Each caller gets the
        reply of a GET sent after it asked, so it sees every write that
        returned before it asked, its own included.
        """
        while (pending := self._reads.get(name)) is not None:
            with self._reads_lock:  # against the read finishing meanwhile
                if pending.finished:
                    break
                batch = pending.next
                first = batch is None
                if batch is None:
                    # The first to come while it is in flight waits for it,
                    # then sends the batch's read.
                    batch = pending.next = _SharedRead()
                    done = pending.done = pending.done or AsyncEvent()
                else:
                    done = batch.done = batch.done or AsyncEvent()
            if not first:
                await done.wait()  # bounded by the sender's socket timeout
                if isinstance(batch.error, _ReadAbandoned):
                    # Its sender was cancelled: read again, sharing the reads of
                    # those who were waiting too (one read each would empty the pool).
                    continue
                if batch.error is not None:
                    raise batch.error
                return batch.raw
            try:
                await done.wait()
            except BaseException:
                # Cancelled: whoever waits on the batch reads again by themselves.
                with self._reads_lock:
                    if pending.next is batch:
                        pending.next = None
                    batch.error, batch.finished, waiting = _ReadAbandoned(), True, batch.done
                if waiting is not None:
                    waiting.set()
                raise
            if isinstance(pending.error, redis.exceptions.RedisError):
                # Redis failed after they asked: theirs to know, without one
                # more GET to a server that is failing (a failover).
                self._finish_read(batch, pending.error)
                raise pending.error
            return await self._send_read(name, batch)
        return await self._send_read(name, _SharedRead())

    def _finish_read(self, read: _SharedRead, error: BaseException | None) -> None:
        with self._reads_lock:
            read.error = error
            read.finished = True
            done = read.done
        if done is not None:
            done.set()

    async def _send_read(self, name: bytes, read: _SharedRead) -> bytes | None:
        reads = self._reads
        reads[name] = read
        near = self._near
        token = near.begin_fill(name) if near is not None else None  # before the GET is sent
        replicas = self._replicas
        error: BaseException | None = None
        try:
            try:
                read.raw = await (self._reader() if replicas else self._client).get(name)
            except AttributeError as exc:
                lost = lost_connection(exc)
                if lost is None:
                    raise
                raise lost from exc
        except BaseException as exc:
            error = exc if isinstance(exc, redis.exceptions.RedisError) else _ReadAbandoned()
            raise
        finally:
            if near is not None:  # keeps the value, or (after an error) just drops the token
                near.end_fill(name, token, read.raw)
            if reads.get(name) is read:
                reads.pop(name, None)
            self._finish_read(read, error)
        return read.raw

    # --- this process's flight for a key ------------------------------------

    async def _single_flight(
        self, keys: Keys, options: Options, lookup: Lookup, rebuild: AsyncRebuilder[Any]
    ) -> Any:
        missed = False  # whether this call was reported as a miss
        while True:
            flight, leader = self._flights.join(keys.value)
            if leader:
                break
            late = flight.overtaken  # joined after a write of this process: read again after it
            if lookup.entry is not None:
                return self._serve_follower(keys, lookup.entry)
            if not async_can_block():
                return await self._drive(self._flow(keys, options).without_waiting(), keys, options, rebuild)
            missed = self._miss_once(keys, missed)
            started = self._clock.monotonic()
            if not await flight.done.wait(options.wait_timeout):
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
        flow = self._flow(keys, options, can_wait=async_can_block(), missed=missed)
        return await self._lead(keys.value, flight, flow, flow.run(lookup), keys, options, rebuild)

    async def _after_wait_timeout(self, keys: Keys, options: Options, rebuild: AsyncRebuilder[Any]) -> Any:
        # Callers that gave up on this process's own flight share one
        # fallback, so a slow rebuild is not joined by one more per caller.
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
        flight: Flight[AsyncEvent],
        flow: Flow,
        steps: Generator[Op, Any, Any],
        keys: Keys,
        options: Options,
        rebuild: AsyncRebuilder[Any],
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
        rebuild: AsyncRebuilder[Any],
        flight: Flight[AsyncEvent],
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

        try:
            self._background.start(refresh, f"stampede-refresh {keys.name}")
        except RuntimeError as exc:  # shutting down
            logger.info("cannot refresh %r in the background: %s", keys.name, exc)
            self._flights.finish(keys.value, flight, error=exc)

    # --- running the flow ---------------------------------------------------

    async def _drive(
        self,
        flow: Generator[Op, Any, Any],
        keys: Keys,
        options: Options,
        rebuild: AsyncRebuilder[Any] | None,
        reply: Any = None,
    ) -> Any:
        """Run ``flow`` to its end and return its result. Without a
        ``rebuild`` function, stop where the flow asks for a rebuild and
        return :class:`Paused` (the caller rebuilds: see :meth:`read`)."""
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
            except AsyncDetached as detached:
                # The rest of this flow (commit, release) belongs to the
                # rebuild still running; the cancelled caller leaves now.
                finish = functools.partial(self._finish_detached, flow, detached, keys, options, rebuild)
                self._background.start(finish, "stampede-finish")
                raise detached.cancellation() from None
            except BaseException as exc:  # includes cancellation: the flow cleans up
                failure = exc

    async def _finish_detached(
        self,
        flow: Generator[Op, Any, Any],
        detached: AsyncDetached,
        keys: Keys,
        options: Options,
        rebuild: AsyncRebuilder[Any] | None,
    ) -> None:
        try:
            await self._drive(flow, keys, options, rebuild, await detached.rebuilt())
        except Exception as exc:  # nobody is left to receive it
            logger.warning("rebuild of %r outlived its cancelled caller and failed", keys.name, exc_info=exc)

    async def _execute(
        self, op: Op, keys: Keys, options: Options, rebuild: AsyncRebuilder[Any] | None
    ) -> Any:
        if isinstance(op, Rebuild):
            assert rebuild is not None  # _drive pauses at a Rebuild when there is none
            return await self._rebuild(op.token, keys, options, rebuild)
        if isinstance(op, Wait):
            return await self._wait(op, keys)
        if isinstance(op, Sleep):
            await async_sleep(op.seconds)
            return None
        if isinstance(op, Standby):
            return await self._standby_get(keys)
        if isinstance(op, Reread):
            return await self._reread(keys)
        script, args = self._op_call(op, keys, options)
        if isinstance(op, Release):
            if op.detached:
                release = functools.partial(self._release_until_answered, keys, args, options)
                try:
                    self._background.start(release, "stampede-release")
                except RuntimeError:  # shutting down: the lease expires by itself
                    pass
                return None
            try:
                # Shielded: a caller cancelled mid-release still frees the lease.
                await async_shield(self._script(script, keys, args))
            except RedisUnavailableError:
                pass  # logged as an event already; the lease TTL cleans up
            return None
        if isinstance(op, Commit):
            # Shielded: a cancelled caller's value still lands, freeing the lease.
            return self._op_result(op, await async_shield(self._script(script, keys, args)))
        return self._op_result(op, await self._script(script, keys, args))

    async def _release_until_answered(self, keys: Keys, args: list[Any], options: Options) -> None:
        give_up_at = time.monotonic() + options.lease_ttl  # it has expired by then anyway
        delay = 0.1
        while True:
            try:
                await self._script("release", keys, args)
                return
            except RedisUnavailableError:
                if time.monotonic() + delay >= give_up_at:
                    return
                await async_sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _pause(self, seconds: float) -> None:
        await async_sleep(seconds)

    async def _script(self, name: str, keys: Keys, args: list[Any]) -> Any:
        try:
            with self._redis_errors(keys.name, name):
                if self._sharded is None:
                    await self._ask_sharded()
                return await self._scripts_now()[name](keys=keys.script_keys, args=args)
        finally:
            self._wrote(name, keys)

    # --- the rebuild, its lease renewed meanwhile ---------------------------

    async def _rebuild(
        self, token: str | None, keys: Keys, options: Options, rebuild: AsyncRebuilder[Any]
    ) -> Rebuilt:
        if not async_runs_in_thread(rebuild):
            # Cancelling the caller cancels the rebuild; the flow then frees the lease.
            return await self._renewed_while(token, keys, options, rebuild)
        # A thread cannot be stopped: freeing the lease when the caller is
        # cancelled would let a second rebuild start beside it, so the
        # rebuild finishes and commits instead.
        return await AsyncDetached.outlive(self._renewed_while(token, keys, options, rebuild))

    async def _renewed_while(
        self, token: str | None, keys: Keys, options: Options, rebuild: AsyncRebuilder[Any]
    ) -> Rebuilt:
        """Run ``rebuild``, renewing the lease ``token`` (if any) meanwhile."""
        watchdog = stop = None
        interval = renew_interval(options.lease_ttl)
        if token is not None:
            stop = AsyncEvent()
            renew = functools.partial(self._renew_until_lost, keys, token, options, stop, interval)
            watchdog = AsyncWorker(renew, "stampede-lease-watchdog")
        started = self._clock.monotonic()
        value: Any = None
        error: BaseException | None = None
        try:
            value = await async_rebuild_call(rebuild)
        except BaseException as exc:
            error = exc
        duration = self._clock.monotonic() - started
        lost = False
        if watchdog is not None and stop is not None:
            stop.set()
            # Bounded: a renewal stuck on a stalled Redis must not hold up the
            # caller, and it cannot do harm (renewals are owner-checked).
            lost = bool(watchdog.stop(interval))
        return Rebuilt(value, error, duration, lost)

    async def _renew_until_lost(
        self, keys: Keys, token: str, options: Options, stop: AsyncEvent, interval: float
    ) -> bool:
        """Renew the lease every ``interval`` until ``stop`` is set (``False``),
        the lease is found lost (``True``), or ``max_lease_time`` passes."""
        give_up_at = time.monotonic() + options.max_lease_time
        while not await stop.wait(interval):
            if time.monotonic() >= give_up_at:
                logger.warning("lease on %r held for max_lease_time; no longer renewing it", keys.name)
                return False
            try:
                renewed = await self._script("extend", keys, [token, options.lease_ms])
            except RedisUnavailableError as exc:
                logger.warning("could not renew the lease on %r, will retry: %s", keys.name, exc)
                continue
            if not renewed:
                return True
        return False

    async def _wait(self, op: Wait, keys: Keys) -> Waited:
        # Woken through the process's one subscriber: waiting holds no pool
        # connection, only a probe's round trip when there is news.
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
                        # Freed without a (new) value: released (announced)
                        # or expired. The announcement may still be on its way.
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
        """:meth:`get_or_rebuild` for callers that rebuild by themselves.

        For cache APIs where a miss from ``get`` is followed by the caller's
        own ``set``. Fresh: ``Read(found=True, value)``. Stale: every caller
        gets the stale value except the one that wins the lease, which gets
        a miss and the :class:`Lease`. Missing: one caller gets a miss and the
        lease; the others wait (up to ``wait_timeout``) for its commit. A miss
        without a lease (after ``wait_timeout``, or fail-open) means: rebuild,
        but nothing to commit. Unlike :meth:`get_or_rebuild`, callers are not
        coalesced within the process (the rebuild is out of our hands), and
        the lease is not renewed: commit within ``lease_ttl``.
        """
        options = self._call_options(ttl, stale_ttl, lease_ttl, wait_timeout, UNSET, beta)
        keys = self._keys(key)
        lookup = await self._first_read(keys, options)
        if isinstance(lookup, Entry):
            return Read(True, lookup.value)
        can_wait = async_can_block()
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
            if not can_wait:
                self._emit(keys, EventKind.NO_WAIT)
                return Read(False)
            missed = self._miss_once(keys, missed)
            started = self._clock.monotonic()
            remaining = deadline - started
            if remaining <= 0 or not await flight.done.wait(remaining):
                return self._read_timed_out(keys, options)
            self._waited(keys, started)
            if flight.abandoned or late:
                continue
            shared = flight.outcome()
            if shared is not LEASE_TAKEN:
                return shared  # type: ignore[no-any-return]
            # A caller of this process rebuilds under the lease: the next
            # flight waits for its commit.
        try:
            flow = self._flow(
                keys, options, take_over=False, can_wait=can_wait, deadline=deadline, missed=missed
            )
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
        """Store ``value`` under the lease from :meth:`read`, wake the waiters
        and free the lease; ``ttl``/``stale_ttl`` default to those of the
        ``read``. Returns whether it was stored: ``False`` when the lease had
        lapsed or been cancelled (a newer write stays). With
        ``store_if_lapsed``, a lease that merely lapsed (nobody else holds one,
        and nothing stored is newer than the ``read``) still stores: the
        semantics of a cache ``set`` that came late.
        """
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
        """Give up a lease from :meth:`read` without storing anything, so that
        another caller can rebuild at once."""
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
        """Decorate a function so its results are cached with :meth:`get_or_rebuild`.

        The key is the function's module and qualified name plus the
        ``repr`` of its bound arguments, unless ``key`` (a fixed string, or a
        function of the same arguments returning one) says otherwise. The
        decorated function gains ``key(*args)``, ``invalidate(*args)`` and
        ``delete(*args)``.
        """
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

    # --- lifecycle ----------------------------------------------------------

    async def __aenter__(self) -> Stampede:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Wait for background refreshes to finish; close the client too if
        :meth:`from_url` created it."""
        await self._background.join()
        if self._near is not None:
            self._subscriber.untrack(self._near)
        await async_close_subscriber(self._subscriber, self._owns_client)
        standbys = list(self._standby.values())
        self._standby.clear()
        for standby in standbys:
            await standby.aclose()
        if self._owns_client:
            await async_close_client(self._client)
            for owned in self._owned:
                await owned.aclose()


def redis_client(url: str, *, cluster: bool = False, **options: Any) -> Any:
    """A redis-py client for ``url``: one server (``redis://``, ``rediss://``,
    ``unix://``), a Redis Cluster (``redis+cluster://``, or ``cluster=True``) or
    the master of a Sentinel-watched service (``redis+sentinel://``); see
    :meth:`Stampede.from_url`. ``options`` go to redis-py (``socket_timeout``
    and the like). For integrations that build their own client; a bad URL is
    a :class:`~stampede.ConfigurationError` naming it.
    """
    return connect(url, asynchronous=True, cluster=cluster, **options)[0]
