"""The driver: :class:`Stampede`, which runs the core's sans-IO machines on Redis.

Written once, for asyncio; the blocking twin (``stampede/_sync/stampede.py``)
is generated from this file by ``python tools/unasync.py`` (``make lint``
checks that the two agree). What differs between the flavours is in
``stampede/_primitives/``. Under asyncio, rebuild functions may be
coroutine functions or plain callables; plain ones run in a worker thread so
that a slow rebuild never blocks the event loop.

A call reads top to bottom: :meth:`Stampede.get_or_rebuild` reads (a near
copy, else one GET shared by concurrent callers) and serves a fresh hit;
anything else is the machine of the call (``stampede/_core/calls.py``),
which the runner drives, carrying out each operation it yields (a script, a
wait, the rebuild). Every decision is the machine's.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import redis.exceptions

from .._core.batch import get_or_rebuild_many
from .._core.cached import CachedFunction, check_decorated, key_builder
from .._core.calls import Calls
from .._core.clock import Clock
from .._core.codec import NOT_PLAIN
from .._core.envelope import Entry
from .._core.events import EventHook, logger
from .._core.keys import Keys
from .._core.near import NOT_HERE
from .._core.ops import Lookup
from .._core.options import UNSET, NoMore, Options, unknown_arguments
from .._core.owed import OwedBook
from .._core.serializers import Serializer
from .._core.settings import Settings
from .._core.tags import TagsUnknown
from .._core.turns import KeyLocks
from .._exceptions import ConfigurationError
from .._primitives import (
    AsyncBackground,
    AsyncEvent,
    AsyncLock,
    AsyncRebuilder,
    async_can_block,
    async_close_client,
    async_forks_with,
)
from .._protocol.clients import check_client, fails_over
from .._protocol.urls import connect, split_options
from .groups import AsyncGroups
from .keeper import AsyncLeaseKeeper
from .lease_api import NONE_GIVEN, AsyncLeases
from .lookups import AsyncLookups
from .operations import AsyncOperations
from .reads import AsyncSharedReads
from .runner import AsyncRunner
from .server import AsyncServer
from .subscriber import async_subscriber_for

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Stampede", "redis_client"]

T = TypeVar("T")


class Stampede(AsyncLeases, AsyncOperations):
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
        self._near = settings.near_store()
        #: The machines of this instance's calls, and what its callers share.
        self._calls = Calls(settings, AsyncEvent, fails_over=fails_over(client), near=self._near)
        self._server = AsyncServer(client, tuple(replicas), settings, self._calls)
        if settings.near is not None and (self._server.cluster or replicas):
            # Tracking is per node, and replicas lag: neither is coherent yet.
            raise ConfigurationError(
                "near_cache is not supported with a Redis Cluster client or replicas= yet",
                field="near_cache",
            )
        self._background = AsyncBackground(background_workers)
        # Bound once: they are on every hit.
        self._keys = settings.keys
        self._call_options = settings.call_options
        self._options = settings.options
        self._lookup = settings.judge.lookup
        self._clock = settings.clock
        self._owns_client = False  # set by from_url(), whose client close() closes
        self._owned: list[Any] = []  # more clients from_url() made (a Sentinel's), closed with it
        self._turns = KeyLocks(AsyncLock)
        self._owed = OwedBook()
        self._paying = AsyncLock()
        self._payer = None
        self._subscriber = async_subscriber_for(client)
        # Hits of the common case, read without events (see Codec.plain_value).
        self._plain_hits = settings.on_event is None
        self._plain_value = settings.codec.plain_value
        self._now = settings.clock.time
        if self._near is not None:
            self._subscriber.track(self._near)
            self._subscriber.track(settings.tags)  # tag states, dropped as soon as they change
        self._reads = AsyncSharedReads(self._server, self._near, self._settings.tags)
        self._groups = AsyncGroups(settings, self._server, self._reads)
        self._lookups = AsyncLookups(
            settings, self._server, self._reads, self._groups, self._subscriber, self._near
        )
        self._keeper = AsyncLeaseKeeper(self._server, settings.clock)
        self._runner = AsyncRunner(
            settings,
            self._server,
            self._lookups,
            self._subscriber,
            self._background,
            self._groups,
            self._keeper,
        )
        async_forks_with(self)

    def _forked(self) -> None:
        """In a child process just forked: what other threads had under way
        (reads, rebuilds, background refreshes) did not come along, and the
        locks they held are dropped with them."""
        self._reads.forked()
        self._server.forked()
        self._settings.tags.forked()
        self._calls.forked()
        self._turns = KeyLocks(AsyncLock)
        self._owed.forked()
        self._paying = AsyncLock()
        self._payer = None
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
        options = self._options if given == NONE_GIVEN else self._call_options(*given)
        if not callable(rebuild):
            raise ConfigurationError(f"rebuild must be callable, got {rebuild!r}", field="rebuild")
        tag_ids = self._settings.tag_ids(tags) if tags else ()
        near = self._near
        if near is not None and options.beta is None:
            value = near.serve(key)  # the hot index: most near hits end here
            if value is not NOT_HERE:
                return value  # type: ignore[no-any-return]
        keys = self._keys(key)
        # _first_read, inlined: this is every other hit's path.
        if near is not None:
            near_found = await self._lookups.near(keys, options, key)
            if isinstance(near_found, Entry):
                return near_found.value  # type: ignore[no-any-return]
            if near_found is not None:
                return cast(T, await self._missed(keys, options, near_found, rebuild, tag_ids))
        if self._owed.pending:
            await self._pay_owed()
        try:
            raw = await self._reads.get(keys.value)
        except redis.exceptions.RedisError as exc:
            lookup = self._server.read_failed(keys, exc)
            return cast(T, await self._missed(keys, options, lookup, rebuild, tag_ids))
        if self._plain_hits and options.beta is None:
            value = self._plain_value(keys.value, raw, self._now())
            if value is not NOT_PLAIN:
                return value  # type: ignore[no-any-return]
        found = self._lookup(keys, raw, options)
        if isinstance(found, Entry):
            # Not cast(): a function call, on every hit.
            return found.value  # type: ignore[no-any-return]
        if isinstance(found, TagsUnknown):
            found = await self._lookups.judged(keys, raw, options, found)
            if isinstance(found, Entry):
                return found.value  # type: ignore[no-any-return]
        return cast(T, await self._missed(keys, options, found, rebuild, tag_ids))

    async def _missed(
        self,
        keys: Keys,
        options: Options,
        lookup: Lookup,
        rebuild: AsyncRebuilder[Any],
        tags: tuple[bytes, ...],
    ) -> Any:
        """A ``get_or_rebuild`` past a first read that was not a hit."""
        steps = self._calls.get_or_rebuild(keys, options, lookup, tags, can_wait=async_can_block())
        return await self._runner.drive(steps, keys, options, rebuild)

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
        if not callable(rebuild_many):
            raise ConfigurationError(
                f"rebuild_many must be callable, got {rebuild_many!r}", field="rebuild_many"
            )
        named = self._settings.many(keys)
        if not named:
            return {}
        if self._owed.pending:
            await self._pay_owed()
        steps = get_or_rebuild_many(self._calls, named, options, tag_ids, can_wait=async_can_block())
        return cast(dict[Any, Any], await self._runner.drive(steps, None, options, rebuild_many))

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
        if self._owed.pending:
            await self._pay_owed()  # a last try
        lost = self._owed.abandon()  # which also ends the background payer
        if lost:
            logger.warning("closed with %d removal(s) that Redis never took (fail_open)", lost)
        if self._payer is not None:
            self._payer.stop(0)
        await self._server.stop_probes()
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
