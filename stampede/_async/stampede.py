"""The driver: :class:`Stampede`, which runs the sans-IO :class:`~stampede._core.flow.Flow` on Redis.

Written once, for asyncio; the blocking twin (``stampede/_sync/stampede.py``)
is generated from this file by ``python tools/unasync.py`` (``make lint``
checks that the two agree). What differs between the flavours is in
``stampede/_primitives/``. Under asyncio, rebuild functions may be
coroutine functions or plain callables; plain ones run in a worker thread so
that a slow rebuild never blocks the event loop.

A call reads top to bottom: :meth:`Stampede.get_or_rebuild` reads (a near
copy, else one GET shared by concurrent callers), then, on a miss, joins or
leads this process's flight for the key; the leader drives the key's flow,
carrying out each operation it yields (a script, a wait, the rebuild).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import redis.exceptions

from .._core.cached import CachedFunction, check_decorated, key_builder
from .._core.envelope import NOT_PLAIN, Entry
from .._core.events import EventHook, EventKind, logger
from .._core.flights import KeyLocks, LocalFlight, LocalFlights
from .._core.flow import (
    Clock,
    Flow,
    Lookup,
    Op,
    Release,
)
from .._core.keys import Keys
from .._core.near import NOT_HERE
from .._core.options import UNSET, NoMore, Options, unknown_arguments
from .._core.reads import LEASE_TAKEN, Lease, Paused, Read
from .._core.scope import LeaseScope
from .._core.serializers import Serializer
from .._core.settings import Settings
from .._core.tags import TagsUnknown
from .._exceptions import ConfigurationError
from .._primitives import (
    AsyncBackground,
    AsyncEvent,
    AsyncLock,
    AsyncRebuilder,
    async_can_block,
    async_close_client,
    async_contextmanager,
    async_current_owner,
    async_forks_with,
)
from .._redis import scripts as lua
from .._redis.clients import check_client
from .._redis.urls import connect, split_options
from .batches import AsyncBatches
from .groups import AsyncGroups
from .keeper import AsyncLeaseKeeper
from .operations import AsyncOperations
from .reads import AsyncSharedReads
from .runner import AsyncFlowRunner
from .server import AsyncServer
from .subscriber import async_subscriber_for

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Stampede", "redis_client"]

T = TypeVar("T")
#: Builds a Read from a tuple without NamedTuple's Python-level __new__ (a hit's path).
_found = tuple.__new__
#: A call's options as given when it left them all to the instance.
_NONE_GIVEN = (UNSET,) * 6


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
        near_cache: keep recently read values in this process, kept
            coherent by Redis's client-side tracking: ``True`` (default
            bounds), a number of entries, or a :class:`~stampede.NearCache`;
            ``None`` or ``False`` (the default): none. Not with a Redis
            Cluster client or ``replicas`` yet.
        on_event: called with every :class:`~stampede.Event`.
        clock: time source with ``time()`` and ``monotonic()``.
        replicas: clients of the master's replicas (of the same flavour
            as ``client``), read (stale if error) when the master fails.
        background_workers: how many background refreshes run at once:
            threads of a pool for the blocking flavour, tasks of the running
            loop for asyncio.
        tag_check_interval: how long (seconds) this process trusts the state
            of a tag (and of the namespace) it read: the bound on how late
            it sees another process's ``invalidate_tags``/``invalidate_all``.
            With a near cache, Redis tells it of those at once as well.
        compress_above: values whose serialized form is at least this many
            bytes are stored deflated (zlib) when that saves an eighth or
            more; ``None``: never. Readers inflate whatever they find,
            whatever their own setting.

    Under asyncio, a caller cancelled while its plain (non-async) rebuild
    function runs in a thread gets its cancellation at once; the thread's
    result is still committed under the lease, which is released after it.
    """

    def __init__(
        self,
        client: Any,
        *,
        namespace: str = "stampede",
        options: Options | None = None,
        serializer: Serializer | None = None,
        signing_key: Any = None,
        near_cache: Any = None,
        on_event: EventHook | None = None,
        clock: Clock | None = None,
        replicas: Sequence[Any] = (),
        background_workers: int = 4,
        tag_check_interval: float = 0.1,
        compress_above: int | None = 1024,
        **option_values: Any,
    ) -> None:
        check_client(client, asynchronous=True)
        for i, replica in enumerate(replicas):
            check_client(replica, asynchronous=True, argument=f"replicas[{i}]")
        settings = Settings(
            namespace=namespace,
            options=options,
            serializer=serializer,
            signing_key=signing_key,
            near_cache=near_cache,
            on_event=on_event,
            clock=clock,
            tag_check_interval=tag_check_interval,
            compress_above=compress_above,
            option_values=option_values,
        )
        self._settings = settings
        self._server = AsyncServer(client, tuple(replicas), settings, self._after_script)
        if settings.near is not None and (self._server.cluster or replicas):
            # Tracking is per node, and replicas lag: neither is coherent yet.
            raise ConfigurationError(
                "near_cache is not supported with a Redis Cluster client or replicas= yet"
            )
        self._background = AsyncBackground(background_workers)
        # Bound once: they are on every hit.
        self._keys = settings.keys
        self._call_options = settings.call_options
        self._options = settings.options
        self._lookup = settings.lookup
        self._clock = settings.clock
        self._owns_client = False  # set by from_url(), whose client close() closes
        self._owned: list[Any] = []  # more clients from_url() made (a Sentinel's), closed with it
        self._flights: LocalFlights[AsyncEvent] = LocalFlights(AsyncEvent)
        self._turns = KeyLocks(AsyncLock)
        self._subscriber = async_subscriber_for(client)
        self._near = settings.near_store()
        self._indexes_hot = settings.indexes_hot
        # Hits of the common case, read without events (see Codec.plain_value).
        self._plain_hits = settings.on_event is None
        self._plain_value = settings.codec.plain_value
        self._now = settings.clock.time
        if self._near is not None:
            self._subscriber.track(self._near)
            self._subscriber.track(settings.tags)  # tag states, dropped as soon as they change
        self._reads = AsyncSharedReads(self._server, self._near)
        self._groups = AsyncGroups(settings, self._server, self._reads)
        self._runner = AsyncFlowRunner(
            settings, self._server, self._subscriber, self._background, self._groups
        )
        self._keeper = AsyncLeaseKeeper(self._server, settings.clock)
        self._batches = AsyncBatches(
            settings,
            self._server,
            self._groups,
            self._runner,
            self._subscriber,
            self._near,
            self._one_key,
            self._background,
        )
        async_forks_with(self)

    def _forked(self) -> None:
        """In a child process just forked: what other threads had under way
        (reads, rebuilds, background refreshes) did not come along, and the
        locks they held are dropped with them."""
        self._reads.forked()
        self._settings.tags.forked()
        self._batches.forked()
        self._flights = LocalFlights(AsyncEvent)
        self._turns = KeyLocks(AsyncLock)
        self._background.forked()
        self._keeper.forked()

    @property
    def namespace(self) -> str:
        """The prefix of every Redis key this instance writes."""
        return self._settings.keys.namespace

    @property
    def options(self) -> Options:
        """This instance's default options."""
        return self._settings.options

    @property
    def serializer(self) -> Serializer:
        """How this instance stores values."""
        return self._settings.serializer

    @property
    def client(self) -> Any:
        """The redis-py client this instance talks through (the primary)."""
        return self._server.client

    @property
    def replicas(self) -> tuple[Any, ...]:
        """The clients plain reads may go to, if any."""
        return self._server.replicas

    def __repr__(self) -> str:
        return f"{type(self).__name__}(namespace={self.namespace!r}, {self.options!r})"

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
        tags: Sequence[str] = (),
        **unknown: Unpack[NoMore],
    ) -> T:
        """Return the cached value of ``key``, rebuilding it with ``rebuild()``
        in exactly one caller when it is stale or missing.

        Fresh: one GET. Stale: one caller (cluster-wide) refreshes, the others
        get the stale value at once. Missing: one caller rebuilds, the others
        wait to be woken, for at most ``wait_timeout``. Options left out take
        this instance's defaults (see :class:`~stampede.Options`). Exceptions
        from ``rebuild`` reach the caller unchanged. ``tags``: the groups the
        value belongs to (see :meth:`invalidate_tags`).
        """
        if unknown:
            raise unknown_arguments(self.get_or_rebuild, unknown)
        given = (ttl, stale_ttl, lease_ttl, wait_timeout, background, beta)
        # The instance's options when none is given, without a call: a hit's path.
        options = self._options if given == _NONE_GIVEN else self._call_options(*given)
        if not callable(rebuild):
            raise ConfigurationError(f"rebuild must be callable, got {rebuild!r}")
        tag_ids = self._settings.tag_ids(tags) if tags else ()
        near = self._near
        if near is not None and options.beta is None:
            value = near.serve(key)  # the hot index: most near hits end here
            if value is not NOT_HERE:
                return value  # type: ignore[no-any-return]
        keys = self._keys(key)
        # _first_read, inlined: this is every other hit's path.
        if near is not None:
            near_found = await self._near_read(keys, options, key)
            if isinstance(near_found, Entry):
                return near_found.value  # type: ignore[no-any-return]
            if near_found is not None:
                return cast(T, await self._single_flight(keys, options, near_found, rebuild, tag_ids))
        try:
            raw = await self._reads.get(keys.value)
        except redis.exceptions.RedisError as exc:
            lookup = self._server.read_failed(keys, exc)
            return cast(T, await self._single_flight(keys, options, lookup, rebuild, tag_ids))
        if self._plain_hits and options.beta is None:
            value = self._plain_value(keys.value, raw, self._now())
            if value is not NOT_PLAIN:
                return value  # type: ignore[no-any-return]
        found = self._lookup(keys, raw, options)
        if isinstance(found, Entry):
            # Not cast(): a function call, on every hit.
            return found.value  # type: ignore[no-any-return]
        if isinstance(found, TagsUnknown):
            found = await self._judged(keys, raw, options, found)
            if isinstance(found, Entry):
                return found.value  # type: ignore[no-any-return]
        return cast(T, await self._single_flight(keys, options, found, rebuild, tag_ids))

    async def get_or_rebuild_many(
        self,
        keys: Iterable[str | bytes],
        rebuild_many: Callable[[list[Any]], Any],
        *,
        ttl: float | None = UNSET,
        stale_ttl: float = UNSET,
        lease_ttl: float = UNSET,
        wait_timeout: float = UNSET,
        beta: float | None = UNSET,
        tags: Sequence[str] = (),
        **unknown: Unpack[NoMore],
    ) -> dict[Any, Any]:
        """:meth:`get_or_rebuild` for many keys at once; returns ``{key: value}``.

        Fresh keys cost one read for the whole batch (an ``MGET``, one per
        slot on a cluster). ``rebuild_many(keys)`` is called once with the
        keys this caller holds leases for (in the order given) and returns a
        mapping of those keys to their values; a key it leaves out is not
        stored and not returned. Stale keys that another caller refreshes are
        served stale; missing keys that another caller rebuilds are waited
        for. Each key is single-flight across processes, as with
        :meth:`get_or_rebuild`. Under asyncio, ``rebuild_many`` may be a
        coroutine function.
        """
        if unknown:
            raise unknown_arguments(self.get_or_rebuild_many, unknown)
        options = self._call_options(ttl, stale_ttl, lease_ttl, wait_timeout, UNSET, beta)
        tag_ids = self._settings.tag_ids(tags) if tags else ()
        return await self._batches.get_or_rebuild_many(keys, rebuild_many, options, tag_ids)

    async def _one_key(
        self, keys: Keys, options: Options, rebuild: AsyncRebuilder[Any], tags: tuple[bytes, ...]
    ) -> Any:
        """:meth:`get_or_rebuild` of one key, its options settled."""
        found = await self._first_read(keys, options)
        if isinstance(found, Entry):
            return found.value
        return await self._single_flight(keys, options, found, rebuild, tags)

    async def _first_read(self, keys: Keys, options: Options, key: Any = None) -> Entry | Lookup:
        """The hit (the fresh :class:`Entry` to serve), or what the flow needs."""
        if self._near is not None:
            near_found = await self._near_read(keys, options, key)
            if near_found is not None:
                return near_found
        try:
            raw = await self._reads.get(keys.value)
        except redis.exceptions.RedisError as exc:
            return self._server.read_failed(keys, exc)
        found = self._lookup(keys, raw, options)
        if isinstance(found, TagsUnknown):
            return await self._judged(keys, raw, options, found)
        return found

    async def _judged(
        self, keys: Keys, raw: bytes | None, options: Options, unknown: TagsUnknown
    ) -> Entry | Lookup:
        """What ``raw`` holds once the tag states it needs were read. If Redis
        fails them, the value in hand is not served as fresh: the flow tries to
        refresh it, and serves it stale if Redis fails that too."""
        if not await self._groups.read_lacking(unknown.ids):
            return Lookup(self._settings.decode(keys, raw))
        return self._settings.judged(keys, raw, options)

    async def _near_read(self, keys: Keys, options: Options, key: Any = None) -> Entry | Lookup | None:
        """What this process's copy of ``keys`` says (see ``_near_lookup``),
        if one may be served; ``None``: read Redis. A fresh hit of a caller's
        ``key`` puts the copy in the hot index, where its next hits find it."""
        near = self._near
        assert near is not None
        if not near.live:
            self._subscriber.revive()
            return None
        if not (self._subscriber.quiet() or await self._subscriber.settled()):
            return None
        raw = near.get(keys.value)
        if raw is None:
            return None
        found = self._settings.near_lookup(keys, raw, options)
        if isinstance(found, TagsUnknown):
            return None  # Redis is read, and the tag states with it
        if key is not None and isinstance(found, Entry) and self._indexes_hot:
            near.index(key, keys.value, raw, functools.partial(self._settings.hot_copy, raw))
        return found

    # --- this process's flight for a key ------------------------------------

    async def _single_flight(
        self,
        keys: Keys,
        options: Options,
        lookup: Lookup,
        rebuild: AsyncRebuilder[Any],
        tags: tuple[bytes, ...] = (),
    ) -> Any:
        missed = False  # whether this call was reported as a miss
        while True:
            flight, leader = self._flights.join(keys.value)
            if leader:
                break
            late = flight.overtaken  # joined after a write of this process: read again after it
            if lookup.entry is not None:
                return self._settings.serve_follower(keys, lookup.entry)
            if not async_can_block():
                return await self._runner.drive(
                    self._flow(keys, options).without_waiting(), keys, options, rebuild
                )
            missed = self._settings.miss_once(keys, missed)
            started = self._clock.monotonic()
            if not await flight.done.wait(options.wait_timeout):
                return await self._after_wait_timeout(keys, options, rebuild)
            self._settings.waited(keys, started)
            if flight.superseded or late:
                again = await self._first_read(keys, options)  # what the newer write left
                if isinstance(again, Entry):
                    return again.value
                lookup = again
            elif not flight.abandoned:
                return flight.outcome()
        if options.background and lookup.entry is not None:
            self._refresh_in_background(keys, options, lookup, rebuild, flight, tags)
            return self._settings.serve_follower(keys, lookup.entry)
        flow = self._flow(keys, options, can_wait=async_can_block(), missed=missed, tags=tags)
        return await self._lead_flight(keys.value, flight, flow, flow.run(lookup), keys, options, rebuild)

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
        steps = flow.after_wait_timeout()
        return await self._lead_flight(fallback_key, flight, flow, steps, keys, options, rebuild)

    async def _lead_flight(
        self,
        flight_key: Hashable,
        flight: LocalFlight[AsyncEvent],
        flow: Flow,
        steps: Generator[Op, Any, Any],
        keys: Keys,
        options: Options,
        rebuild: AsyncRebuilder[Any],
    ) -> Any:
        try:
            value = await self._runner.drive(steps, keys, options, rebuild)
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
        flight: LocalFlight[AsyncEvent],
        tags: tuple[bytes, ...],
    ) -> None:
        async def refresh() -> None:
            flow = self._flow(keys, options, background=True, tags=tags)
            try:
                value = await self._runner.drive(flow.run(lookup), keys, options, rebuild)
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

    def _after_script(self, script: str, *written: Keys) -> None:
        """After ``script`` ran on ``written``: the outcomes of flights of
        those keys that were under way are not shared after it (see
        ``LocalFlight.overtaken``)."""
        if script in lua.WRITES:
            near = self._near
            for keys in written:
                value = keys.value
                self._settings.busy.forget(value)
                self._settings.unfilled.forget(value)
                if near is not None:
                    near.invalidate([value])  # this process sees its own write at once
                self._flights.overtake(value, (value, "read"), (value, "after-wait"))

    # --- running the flow ---------------------------------------------------

    def _flow(self, keys: Keys, options: Options, **kwargs: Any) -> Flow:
        """A :class:`Flow` for one call; ``kwargs``: the flow's keyword options."""
        return self._settings.flow(keys, options, fails_over=self._server.fails_over, **kwargs)

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
        tags: Sequence[str] = (),
        scope: LeaseScope | None = None,
        **unknown: Unpack[NoMore],
    ) -> Read:
        """:meth:`get_or_rebuild` for callers that rebuild by themselves.

        For cache APIs where a miss from ``get`` is followed by the caller's
        own ``set``. Fresh: ``Read(found=True, value)``. Stale: every caller
        gets the stale value except the one that wins the lease, which gets
        a miss and the :class:`Lease`. Missing: one caller gets a miss and the
        lease; the others wait (up to ``wait_timeout``) for its commit. A miss
        without a lease (after ``wait_timeout``, or fail-open) means: rebuild,
        but nothing to commit; with ``unfilled`` set, the key is one that
        reads do not fill, and a value may be stored with :meth:`set`.
        Unlike :meth:`get_or_rebuild`, callers are not coalesced within the
        process (the rebuild is out of our hands). ``tags``: those the value
        will carry, if known now (else given to :meth:`commit`).

        ``scope``: the :class:`~stampede.LeaseScope` of the caller's unit of
        work, which keeps a lease won (renewed, if ``scope.renew``) until the
        unit's write takes it or :meth:`settle` gives it back. A read of a key
        whose lease the scope already holds gives that lease back and reads
        again if the same caller (task or thread) read it; another caller of
        the unit gets a miss at once (the unit rebuilds it: it never waits
        for itself). Without a scope, the lease is not renewed: commit within
        ``lease_ttl``.
        """
        if unknown:
            raise unknown_arguments(self.read, unknown)
        if scope is not None and not isinstance(scope, LeaseScope):
            raise ConfigurationError(f"scope must be a stampede.LeaseScope, got {scope!r}")
        given = (ttl, stale_ttl, lease_ttl, wait_timeout, UNSET, beta)
        options = self._options if given == _NONE_GIVEN else self._call_options(*given)
        tag_ids = self._settings.tag_ids(tags) if tags else ()
        near = self._near
        if near is not None and options.beta is None:
            value = near.serve(key)  # the hot index: most near hits end here
            if value is not NOT_HERE:
                return _found(Read, (True, value, None, None, False))
        keys = self._keys(key)
        if scope is not None and scope._held:
            namespace = self._settings.keys.namespace
            reader = scope._reader(namespace, key)
            if reader is not None:
                if reader != async_current_owner():
                    # Another task or thread of this unit of work rebuilds it:
                    # never wait for ourselves.
                    return Read(False)
                # Read twice by the same caller, and not written in between:
                # this unit of work does not fill the key; nobody need wait.
                again = scope._take(namespace, key)
                assert again is not None
                await self._give_back(again, unfilled=not scope.failed)
        lookup = await self._first_read(keys, options, key)
        if isinstance(lookup, Entry):
            return Read(True, lookup.value)
        if lookup.entry is None and lookup.error is None:
            unfilled = self._settings.known_unfilled(keys)
            if unfilled is not None:
                return unfilled
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
                return Read(True, self._settings.serve_follower(keys, lookup.entry))
            if not can_wait:
                self._settings.emit(keys, EventKind.NO_WAIT)
                return Read(False)
            missed = self._settings.miss_once(keys, missed)
            started = self._clock.monotonic()
            remaining = deadline - started
            if remaining <= 0 or not await flight.done.wait(remaining):
                return self._settings.read_timed_out(keys, options)
            self._settings.waited(keys, started)
            if flight.abandoned or late:
                continue
            shared = flight.outcome()
            if shared is not LEASE_TAKEN:
                return shared  # type: ignore[no-any-return]
            # A caller of this process rebuilds under the lease: the next
            # flight waits for its commit.
        try:
            flow = self._flow(
                keys,
                options,
                take_over=False,
                can_wait=can_wait,
                deadline=deadline,
                missed=missed,
                tags=tag_ids,
            )
            outcome = await self._runner.drive(flow.run(lookup), keys, options, None)
            read = (
                self._settings.lease_for(keys, options, flow, outcome)
                if isinstance(outcome, Paused)
                else None
            )
        except BaseException as exc:
            self._flights.finish(flight_key, flight, error=exc)
            raise
        if read is None:
            read = Read(True, outcome)
        self._flights.finish(flight_key, flight, value=LEASE_TAKEN if read.lease is not None else read)
        if scope is not None and read.lease is not None:
            scope._hold(self._settings.keys.namespace, key, read.lease, async_current_owner())
            if scope.renew:
                self._keeper.keep(read.lease)
        return read

    async def commit(
        self,
        lease: Lease,
        value: Any,
        *,
        ttl: float | None = UNSET,
        stale_ttl: float = UNSET,
        store_if_lapsed: bool = False,
        tags: Sequence[str] | None = None,
        **unknown: Unpack[NoMore],
    ) -> bool:
        """Store ``value`` under the lease from :meth:`read`, wake the waiters
        and free the lease; ``ttl``/``stale_ttl`` default to those of the
        ``read``. Returns whether it was stored: ``False`` when the lease had
        lapsed or been cancelled (a newer write stays). With
        ``store_if_lapsed``, a lease that merely lapsed (nobody else holds one,
        and nothing stored is newer than the ``read``) still stores: the
        semantics of a cache ``set`` that came late. ``tags``: those the value
        carries, if not given to :meth:`read`; a tag invalidated since the
        ``read`` leaves the value stored stale (or, deleted, missing).
        """
        if unknown:
            raise unknown_arguments(self.commit, unknown)
        rebuilt = self._settings.rebuilt_by_holder(lease, value)
        options = self._settings.settle_options(lease, ttl, stale_ttl)
        lease._stop_renewing()
        flow = lease._flow
        if tags is not None:
            tag_ids = self._settings.tag_ids(tags)
            if tag_ids != flow.tags:
                try:
                    captured = await self._groups.capture(tag_ids, options, lease._won_at)
                except BaseException:
                    # Nothing stored: the lease is freed for another caller.
                    release = Release(lease.token, detached=True)
                    await self._runner.execute(release, lease.keys, lease._options, None)
                    raise
                flow.tags, flow.captured = tag_ids, captured
        _, error = await self._runner.drive(
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
        self._settings.rebuilt_by_holder(lease, None)  # validates the argument
        await self._give_back(lease, unfilled=False)

    async def _give_back(self, lease: Lease, *, unfilled: bool) -> None:
        """Free ``lease`` without a value; ``unfilled``: its holder's unit of
        work did not fill the key (marked so, if its reader found it missing)."""
        lease._stop_renewing()
        release = Release(lease.token, unfilled=unfilled and lease._on_miss)
        await self._runner.execute(release, lease.keys, lease._options, None)

    # --- a unit of work's leases ----------------------------------------------

    @async_contextmanager
    async def lease_scope(self, *, renew: bool = True) -> AsyncIterator[LeaseScope]:
        """A :class:`~stampede.LeaseScope` for the unit of work this block
        is, settled (:meth:`settle`) when the block ends; failed if it raises.

        ``async with sf.lease_scope() as scope``, then ``sf.read(key,
        scope=scope)`` and, on a miss with a lease, ``sf.commit(
        scope.take(sf, key), value, store_if_lapsed=True)``.
        """
        scope = LeaseScope(renew=renew)
        try:
            yield scope
        except BaseException:
            scope.failed = True
            raise
        finally:
            await self.settle(scope)

    async def settle(self, scope: LeaseScope) -> None:
        """The unit of work ``scope`` stood for has ended: give back the
        leases it still holds of this instance's namespace (reads it never
        followed with a write). Their waiters are woken at once, and each key
        its reader found missing is remembered for ``unfilled_ttl`` as one
        that reads do not fill, unless the unit
        :attr:`~stampede.LeaseScope.failed`."""
        if not isinstance(scope, LeaseScope):
            raise ConfigurationError(f"scope must be a stampede.LeaseScope, got {scope!r}")
        for lease in scope._drain(self._settings.keys.namespace):
            await self._give_back(lease, unfilled=not scope.failed)

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
        tags: Sequence[str] | Callable[..., Sequence[str]] = (),
        **unknown: Unpack[NoMore],
    ) -> Callable[[Callable[..., Any]], CachedFunction[Awaitable[Any]]]:
        """Decorate a function so its results are cached with :meth:`get_or_rebuild`.

        The key is the function's module and qualified name plus the
        ``repr`` of its bound arguments, unless ``key`` (a fixed string, or a
        function of the same arguments returning one) says otherwise. The
        decorated function gains ``key(*args)``, ``invalidate(*args)`` and
        ``delete(*args)``. ``tags``: the groups each result belongs to, or a
        function of the same arguments returning them.
        """
        if unknown:
            raise unknown_arguments(self.cached, unknown)
        overrides: dict[str, Any] = dict(
            ttl=ttl,
            stale_ttl=stale_ttl,
            lease_ttl=lease_ttl,
            wait_timeout=wait_timeout,
            background=background,
            beta=beta,
        )
        self._call_options(**overrides)  # reject bad options when decorating
        if not callable(tags):
            self._settings.tag_ids(tags)  # and bad tags

        def decorate(func: Callable[..., Any]) -> CachedFunction[Awaitable[Any]]:
            check_decorated(func, asynchronous=True)
            key_of = key_builder(func, key)

            @functools.wraps(func)
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                return await self.get_or_rebuild(
                    key_of(*args, **kwargs),
                    functools.partial(func, *args, **kwargs),
                    tags=tags(*args, **kwargs) if callable(tags) else tags,
                    **overrides,
                )

            return CachedFunction.attach(wrapper, key_of, self.invalidate, self.delete)

        return decorate

    # --- lifecycle ----------------------------------------------------------

    async def __aenter__(self) -> Stampede:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Wait for background refreshes to finish, stop renewing the leases
        scopes hold (they lapse within ``lease_ttl``); close the client too
        if :meth:`from_url` created it."""
        await self._background.join()
        self._keeper.stop()
        if self._near is not None:
            self._subscriber.untrack(self._near)
            self._subscriber.untrack(self._settings.tags)
        await self._subscriber.aclose()  # stops listening unless others wait or track through it
        for standby in self._server.standbys.take_made():
            await standby.aclose()
        if self._owns_client:
            await async_close_client(self._server.client)
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
