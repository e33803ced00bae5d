"""What the sync and asyncio ``Stampede`` classes share: everything but I/O."""

from __future__ import annotations

import dataclasses
import os
import random
import struct
import time as _time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.exceptions
import redis.sentinel

from ._core.envelope import (
    FRESH_UNTIL_OFFSET,
    HEADER,
    INT_CODEC,
    MAGIC,
    Codec,
    CorruptEntryError,
    Entry,
)
from ._core.events import Event, EventHook, EventKind, logger
from ._core.flights import Flights
from ._core.flow import (
    CANCELLED,
    RELEASED,
    Acquire,
    Acquired,
    BusyLeases,
    Clock,
    Commit,
    Flow,
    Lookup,
    Rebuilt,
    Refused,
    Release,
    seal,
)
from ._core.keys import Keys, KeySpace
from ._core.near import NearCache, NearStore
from ._core.options import Options
from ._core.serializers import PickleSerializer, Serializer
from ._core.signing import signer_from
from ._exceptions import ConfigurationError, RedisUnavailableError, WaitTimeoutError
from ._redis import scripts as _scripts
from ._redis.nodes import node_client

__all__ = [
    "LEASE_TAKEN",
    "SWAP_BACKOFF",
    "SWAP_MAX_BACKOFF",
    "UNSET",
    "Lease",
    "Paused",
    "Read",
    "StampedeBase",
    "SystemClock",
    "lost_connection",
]


#: The first pause (s) of a signed ``incr`` or ``touch`` that another write overtook.
SWAP_BACKOFF = 0.001
#: Its longest: a loser must keep trying while others write, within ``wait_timeout``.
SWAP_MAX_BACKOFF = 0.05

#: The scripts that change a value (the others take, renew or free leases, or read).
_WRITES = frozenset({"add", "commit", "incr", "invalidate", "swap", "touch", "write"})


#: The error codes redis-py takes off the replies it turns into these classes.
_ERROR_CODES = {
    redis.exceptions.MovedError: "MOVED",
    redis.exceptions.AskError: "ASK",
    redis.exceptions.TryAgainError: "TRYAGAIN",
    redis.exceptions.ClusterDownError: "CLUSTERDOWN",
    redis.exceptions.ReadOnlyError: "READONLY",
    redis.exceptions.NoPermissionError: "NOPERM",
    redis.exceptions.MasterDownError: "MASTERDOWN",
    redis.exceptions.BusyLoadingError: "LOADING",
    redis.exceptions.OutOfMemoryError: "OOM",
    redis.exceptions.NoScriptError: "NOSCRIPT",
}


#: The connection settings a Sentinel-managed master's replicas are read with.
_CONNECTION_SETTINGS = (
    "db",
    "username",
    "password",
    "credential_provider",
    "socket_timeout",
    "socket_connect_timeout",
    "socket_keepalive",
    "socket_keepalive_options",
    "retry_on_timeout",
    "health_check_interval",
    "client_name",
    *(f"ssl_{name}" for name in ("keyfile", "certfile", "cert_reqs", "ca_certs", "ca_data", "ca_path")),
    *(f"ssl_{name}" for name in ("check_hostname", "password", "min_version", "ciphers")),
)


def _sentinel_pool(client: Any) -> Any:
    """The Sentinel-managed pool of ``client`` (a master), or ``None``."""
    pool = getattr(client, "connection_pool", None)
    kinds = (redis.sentinel.SentinelConnectionPool, redis.asyncio.sentinel.SentinelConnectionPool)
    return pool if isinstance(pool, kinds) and pool.is_master else None


def server_words(exc: BaseException) -> str:
    """``exc``'s message with the server's error code put back in front
    (``MOVED 7786 127.0.0.1:7001``, not ``7786 127.0.0.1:7001``)."""
    text = str(exc) or type(exc).__name__  # MaxConnectionsError has no words of its own
    code = next((code for kind, code in _ERROR_CODES.items() if isinstance(exc, kind)), None)
    return f"{code} {text}" if code and not text.startswith(code) else text


_REDIS_PY = os.path.dirname(redis.exceptions.__file__) + os.sep


def lost_connection(exc: AttributeError) -> redis.exceptions.ConnectionError | None:
    """``exc`` as the connection failure it is, if redis-py raised it on a
    connection that another task tore down under the command (its asyncio
    cluster client disconnects a node's connections, in-use ones included,
    after MOVED replies or a failed node: the next write finds its writer
    ``None``); else ``None`` (a bug of its own, to be left raised)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None or not tb.tb_frame.f_code.co_filename.startswith(_REDIS_PY) or "'NoneType'" not in str(exc):
        return None
    lost = redis.exceptions.ConnectionError(f"connection closed under the command ({exc})")
    lost.__cause__ = exc
    return lost


class _Unset:
    def __repr__(self) -> str:
        return "<default>"


#: Marks a per-call option the caller left at the instance's default.
UNSET: Any = _Unset()


#: What a ``read`` flight tells the callers that joined it when its leader
#: took the lease: wait (in the next flight) for that caller's commit.
LEASE_TAKEN: Any = _Unset()


class SystemClock:
    """The real clocks."""

    time = staticmethod(_time.time)
    monotonic = staticmethod(_time.monotonic)


def _check_client(client: object) -> None:
    kwargs_of = getattr(client, "get_connection_kwargs", None)
    if kwargs_of is None:
        raise ConfigurationError(f"client must be a redis-py client, got {type(client).__name__}")
    if kwargs_of().get("decode_responses"):
        raise ConfigurationError(
            "client has decode_responses=True; stampede stores binary envelopes "
            "and needs a client created with decode_responses=False"
        )


_CALL_FIELDS = ("ttl", "stale_ttl", "lease_ttl", "wait_timeout", "background", "beta")
_ALL_UNSET = (UNSET,) * len(_CALL_FIELDS)

_SCRIPTS = (
    *("acquire", "commit", "release", "extend", "probe"),
    *("write", "invalidate", "add", "touch", "incr", "swap"),
)


class Read(NamedTuple):
    """What :meth:`Stampede.read` found.

    ``found`` tells a stored value (possibly ``None``) from a miss. On a
    miss, ``lease`` is set when this caller won the right to rebuild: it
    must pass the value to ``commit(lease, value)`` or give the lease up
    with ``release(lease)``; otherwise the lease lapses after ``lease_ttl``.
    ``stale`` is then the stale :class:`Entry` the others are served, if
    any: what to answer with while refreshing in the background.
    """

    found: bool
    value: Any = None
    lease: Lease | None = None
    #: With a lease: the stale entry others are served meanwhile, if any.
    stale: Entry | None = None


class Lease:
    """The right to rebuild one key, handed out by :meth:`Stampede.read`.

    Belongs to the acquisition, not to a thread: pass it to whoever stores
    the value. Only its holder's ``commit`` stores anything (fenced): a lease
    that lapsed or was cancelled by ``set``/``delete``/``invalidate`` stores
    nothing.
    """

    __slots__ = ("_flow", "_options", "_started", "_won_at", "keys", "token")

    def __init__(
        self, keys: Keys, token: str, flow: Flow, options: Options, started: float, won_at: str | None
    ) -> None:
        self.keys = keys
        self.token = token
        self._flow = flow
        self._options = options
        self._started = started  # monotonic: the rebuild's duration
        self._won_at = won_at  # the server's clock: what a lapsed commit is fenced by

    @property
    def key(self) -> str:
        return self.keys.name

    def __repr__(self) -> str:
        return f"<Lease on {self.key!r}>"


class Paused(NamedTuple):
    """Internal: a flow stopped where it asks for a rebuild (see ``read``)."""

    token: str | None
    stale: Entry | None = None


class StampedeBase:
    """Configuration, key naming, encoding and events; no Redis calls."""

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
        **option_values: Any,
    ) -> None:
        _check_client(client)
        for replica in replicas:
            _check_client(replica)
        base = options if options is not None else Options()
        if not isinstance(base, Options):
            raise ConfigurationError(f"options must be a stampede.Options, got {base!r}")
        if option_values:
            base = Options.from_mapping({**dataclasses.asdict(base), **option_values})
        serializer = serializer if serializer is not None else PickleSerializer()
        if not isinstance(serializer, Serializer):
            raise ConfigurationError(f"serializer must have codec_id, dumps and loads, got {serializer!r}")
        codec_id = serializer.codec_id
        if isinstance(codec_id, bool) or not isinstance(codec_id, int) or not 1 <= codec_id <= 255:
            raise ConfigurationError(f"serializer.codec_id must be an int in 1..255, got {codec_id!r}")
        if on_event is not None and not callable(on_event):
            raise ConfigurationError(f"on_event must be callable, got {on_event!r}")
        self._client = client
        # Redis Cluster clients route each key's commands to its node, but
        # take no scripts in a pipeline.
        self._cluster = isinstance(client, (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster))
        # A Sentinel-managed master's pool: its Sentinels know the replicas.
        self._sentinel_pool = _sentinel_pool(client)
        # Whether a failed primary is replaced (a failover) rather than gone.
        self._fails_over = self._cluster or self._sentinel_pool is not None
        # Clients this instance made to read replicas while a primary fails.
        self._standby: dict[str, Any] = {}
        # Plain reads (the first GET, get, get_many, has_key) may go to a
        # replica; leases, writes and waits always use the primary.
        self._replicas = tuple(replicas)
        self._owns_client = False  # set by from_url(), whose client close() closes
        self._owned: list[Any] = []  # more clients from_url() made (a Sentinel's), closed with it
        self._scripts = {name: client.register_script(getattr(_scripts, name.upper())) for name in _SCRIPTS}
        # On a cluster whose servers have sharded pub/sub (asked at the first
        # script call), the same scripts publishing on the key's own shard.
        self._sharded: bool | None = None if self._cluster else False
        self._sharded_scripts = self._scripts
        if self._cluster:
            self._sharded_scripts = {
                name: client.register_script(_scripts.sharded(getattr(_scripts, name.upper())))
                for name in _SCRIPTS
            }
        self._keys = KeySpace(namespace)
        self.options = base
        self._merged: dict[tuple[Any, ...], Options] = {}
        self.serializer = serializer
        self._codec = Codec(serializer, signer_from(signing_key))
        self._near_settings = NearCache.from_setting(near_cache)
        if self._near_settings is not None and (self._cluster or self._replicas):
            # Tracking is per node, and replicas lag: neither is coherent yet.
            raise ConfigurationError(
                "near_cache is not supported with a Redis Cluster client or replicas= yet"
            )
        # Set by the driver once it tracks the namespace (its subscriber's).
        self._near: NearStore | None = None
        self._decode_raw = self._codec.decode  # bound once: it is on every hit
        self._on_event = on_event
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._now = self._clock.time  # bound once: it is on every hit
        # Keys another process was found refreshing: not asked again for a moment.
        self._busy = BusyLeases()
        self._flights: Flights[Any]  # each driver's, with its own kind of event

    def _standbys(self, name: bytes) -> list[tuple[Any, bool]]:
        """The clients that may hold a copy of ``name`` when its primary fails,
        each with whether it needs READONLY first (a cluster replica)."""
        if self._cluster:
            client = self._client
            nodes = client.nodes_manager.slots_cache.get(client.keyslot(name)) or ()
            return [(self._node_client(node), True) for node in nodes[1:]]
        pool = self._sentinel_pool
        if pool is not None:
            standby = self._standby.get("sentinel")
            if standby is None:
                # Connects lazily: a client made by a thread that loses the
                # race below holds no socket.
                kwargs = pool.connection_kwargs
                standby = self._standby.setdefault(
                    "sentinel",
                    pool.sentinel_manager.slave_for(
                        pool.service_name,
                        connection_class=pool.connection_class,
                        **{key: kwargs[key] for key in _CONNECTION_SETTINGS if key in kwargs},
                    ),
                )
            return [(standby, False)]
        return [(replica, False) for replica in self._replicas]

    def _node_client(self, node: Any) -> Any:
        """This instance's client of one cluster node, made once, closed with it."""
        client = self._standby.get(node.name)
        if client is None:
            made = node_client(self._client, node)
            client = self._standby.setdefault(node.name, made)  # atomic: one per node
            if client is not made:  # another thread's came first (blocking clients only)
                made.close()
        return client

    def _reader(self) -> Any:
        replicas = self._replicas
        return random.choice(replicas) if replicas else self._client

    @property
    def namespace(self) -> str:
        """The prefix of every Redis key this instance writes."""
        return self._keys.namespace

    @property
    def client(self) -> Any:
        """The redis-py client this instance talks through (the primary)."""
        return self._client

    @property
    def replicas(self) -> tuple[Any, ...]:
        """The clients plain reads may go to, if any."""
        return self._replicas

    def __repr__(self) -> str:
        return f"{type(self).__name__}(namespace={self.namespace!r}, {self.options!r})"

    # --- options, keys, events ---------------------------------------------

    def _call_options(
        self,
        ttl: Any = UNSET,
        stale_ttl: Any = UNSET,
        lease_ttl: Any = UNSET,
        wait_timeout: Any = UNSET,
        background: Any = UNSET,
        beta: Any = UNSET,
    ) -> Options:
        """This instance's options with a call's overrides; memoised, as it is on the hit path."""
        values = (ttl, stale_ttl, lease_ttl, wait_timeout, background, beta)
        if values == _ALL_UNSET:
            return self.options
        memo = self._merged
        try:
            # Stored under the bare values only when none of them equals 0
            # or 1: so a bool (True == 1, and hashes alike) never finds
            # them, and ttl=True is never served what was validated for 1.
            return memo[values]
        except KeyError:
            pass
        except TypeError:  # unhashable, hence invalid: merged() says why
            return self.options.merged(self._overrides(values))
        signature = (*values, *map(type, values))  # types in the key: True is not 1
        try:
            return memo[signature]
        except KeyError:
            pass
        merged = self.options.merged(self._overrides(values))
        if len(memo) >= 256:
            memo.clear()
        memo[values if 0 not in values and 1 not in values else signature] = merged
        return merged

    @staticmethod
    def _overrides(values: tuple[Any, ...]) -> dict[str, Any]:
        return {name: value for name, value in zip(_CALL_FIELDS, values, strict=True) if value is not UNSET}

    def _emit(self, keys: Keys, kind: EventKind, **details: Any) -> None:
        self._emit_named(keys.name, kind, **details)

    def _emit_named(self, name: str, kind: EventKind, **details: Any) -> None:
        hook = self._on_event
        if hook is None:
            return
        try:
            hook(Event(kind, name, namespace=self._keys.namespace, **details))
        except Exception:
            # An observer must never break the cache it observes.
            logger.exception("on_event hook raised for %s on %r", kind.value, name)

    @contextmanager
    def _redis_errors(self, name: str, action: str) -> Iterator[None]:
        """Translate redis-py's exceptions into :class:`RedisUnavailableError`, once.

        ``name``: the key concerned, for the message (``""``: several).
        """
        failure: Exception
        try:
            yield
            return
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
            # RedisClusterException is not a RedisError (a cluster that cannot
            # route a command, a refused pipeline): a Redis failure all the same.
            failure = exc
        except AttributeError as exc:
            lost = lost_connection(exc)
            if lost is None:
                raise
            failure = lost
        self._emit_named(name, EventKind.REDIS_ERROR, error=failure)
        where = f" for key {name!r}" if name else ""
        raise RedisUnavailableError(f"Redis failed to {action}{where}: {server_words(failure)}") from failure

    # --- reading ------------------------------------------------------------

    def _decode(self, keys: Keys, raw: bytes | None) -> Entry | None:
        if raw is None:
            return None
        try:
            return self._decode_raw(keys.value, raw)
        except CorruptEntryError as exc:
            logger.warning("ignoring unreadable data under key %r: %s", keys.name, exc)
            self._emit(keys, EventKind.CORRUPT)
            return None

    def _lookup(self, keys: Keys, raw: bytes | None, options: Options) -> Entry | Lookup:
        """What a first read found: the fresh :class:`Entry` to serve (a hit), or
        what the flow needs. On every hit, so the common case comes first."""
        if raw is not None:
            try:
                entry = self._decode_raw(keys.value, raw)
            except CorruptEntryError:
                return Lookup(self._decode(keys, raw))  # logs and reports it
            if self._is_hit(keys, entry, options):
                return entry
            return Lookup(entry)
        return Lookup(None)

    def _near_lookup(self, keys: Keys, raw: bytes, options: Options) -> Entry | Lookup | None:
        """What a near copy holds: the :class:`Entry` to serve (a hit, see
        :meth:`_is_hit`), or, stale or drawn for early refresh, the
        :class:`Lookup` the flow starts from, as from a ``GET`` (Redis holds
        the same: the copy would have been dropped otherwise). So while
        another caller refreshes the key, the stale value is served from the
        process. ``None``: unreadable, read it from Redis."""
        try:
            entry = self._decode_raw(keys.value, raw)
        except CorruptEntryError:
            return None  # Redis holds it too: the read there reports it
        now = self._now()
        if now < entry.fresh_until and (
            options.beta is None or not entry.wants_early_refresh(now, options.beta)
        ):
            if self._on_event is not None:
                self._emit(keys, EventKind.NEAR_HIT)
            return entry
        return Lookup(entry)

    def _near_store(self) -> NearStore | None:
        """The near cache's store, if there is one (made by the driver, which
        then has its subscriber track it)."""
        if self._near_settings is None:
            return None
        report = self._near_dropped if self._on_event is not None else None
        return NearStore(self._near_settings, self._keys.prefix, report)

    def _near_dropped(self, kind: EventKind, name: bytes) -> None:
        self._emit_named(self._keys.key_of(name) if name else "", kind)

    def _is_hit(self, keys: Keys, entry: Entry, options: Options) -> bool:
        """Whether ``entry`` is served as it is: fresh, and not drawn for early refresh."""
        now = self._now()
        if now < entry.fresh_until and (
            options.beta is None or not entry.wants_early_refresh(now, options.beta)
        ):
            if self._on_event is not None:
                self._emit(keys, EventKind.HIT)
            return True
        return False

    def _read_failed(self, keys: Keys, exc: redis.exceptions.RedisError) -> Lookup:
        """The first GET raised: foreign data is a miss, anything else a Redis failure."""
        if isinstance(exc, redis.exceptions.ResponseError) and "WRONGTYPE" in str(exc):
            logger.warning("ignoring key %r: it holds a non-string Redis type", keys.name)
            self._emit(keys, EventKind.CORRUPT)
            return Lookup(None)
        self._emit(keys, EventKind.REDIS_ERROR, error=exc)
        error = RedisUnavailableError(f"Redis failed to read key {keys.name!r}: {exc}")
        error.__cause__ = exc
        return Lookup(None, error=error)

    def _flow(self, keys: Keys, options: Options, **kwargs: Any) -> Flow:
        """A :class:`Flow` for one call; ``kwargs``: the flow's keyword options."""

        def emit(kind: EventKind, **details: Any) -> None:
            self._emit(keys, kind, **details)

        return Flow(
            keys,
            options,
            self._codec,
            lambda raw: self._decode(keys, raw),
            self._clock,
            emit,
            fails_over=self._fails_over,
            busy=self._busy,
            **kwargs,
        )

    def _read_timed_out(self, keys: Keys, options: Options) -> Read:
        """A ``read`` that waited ``wait_timeout`` in vain for its process's flight."""
        self._emit(keys, EventKind.WAIT_TIMEOUT)
        if options.on_wait_timeout == "raise":
            raise WaitTimeoutError(keys.name, options.wait_timeout)
        return Read(False)

    def _miss_once(self, keys: Keys, missed: bool) -> bool:
        """A caller about to wait for a rebuild its process already has under
        way: a miss, reported once per call (its flow, should it lead later,
        does not report it again). Returns ``True``: reported."""
        if not missed:
            self._emit(keys, EventKind.MISS)
        return True

    def _waited(self, keys: Keys, started: float) -> None:
        """A caller's wait for its process's own flight ended (monotonic ``started``)."""
        if self._on_event is not None:
            self._emit(keys, EventKind.WAIT, duration=self._clock.monotonic() - started)

    def _serve_follower(self, keys: Keys, entry: Entry) -> Any:
        """A caller whose process already has a refresh of ``keys`` under way."""
        fresh = entry.is_fresh(self._clock.time())
        self._emit(keys, EventKind.HIT if fresh else EventKind.STALE_HIT)
        return entry.value

    # --- script arguments ---------------------------------------------------

    def _write_args(self, keys: Keys, value: Any, options: Options) -> list[Any]:
        data = seal(self._codec, keys, value, options, now=self._clock.time(), duration=0.0)
        return [data, options.expire_ms or 0, keys.channel, self.options.lapse_ms]

    def _delete_args(self, keys: Keys) -> list[Any]:
        return ["", 0, keys.channel, self.options.lapse_ms]

    def _invalidate_args(self) -> list[Any]:
        return [self._codec.magic, FRESH_UNTIL_OFFSET, b"\x00" * 8, self.options.lapse_ms]

    def _touch_args(self, options: Options) -> list[Any]:
        fresh_until = struct.pack("<d", self._fresh_until(options))
        return [MAGIC, FRESH_UNTIL_OFFSET, fresh_until, options.expire_ms or 0]

    def _fresh_until(self, options: Options) -> float:
        ttl = options.ttl
        return float("inf") if ttl is None else self._clock.time() + ttl

    def _retimed(self, keys: Keys, raw: bytes, options: Options) -> tuple[bytes, str]:
        """A signed ``touch``: the new value of ``keys`` and the SWAP expiry."""
        fresh_until = self._fresh_until(options)
        return self._codec.resigned(keys.value, raw, fresh_until=fresh_until), str(options.expire_ms or 0)

    def _incremented(self, keys: Keys, raw: bytes, delta: int) -> tuple[bytes, int]:
        """A signed ``incr``: the new value of ``keys`` and the new integer."""
        value = self._codec.decode(keys.value, raw).value  # raw was verified: this is cheap
        if type(value) is not int:
            raise TypeError(f"the value of key {keys.name!r} is not an integer")
        total = value + delta
        if not -(2**63) <= total < 2**63:  # as Redis's INCRBY on unsigned values
            raise OverflowError(f"incrementing key {keys.name!r} leaves the 64-bit integer range")
        return self._codec.resigned(keys.value, raw, payload=str(total).encode()), total

    @staticmethod
    def _incr_args(delta: int) -> list[Any]:
        if isinstance(delta, bool) or not isinstance(delta, int):
            raise ConfigurationError(f"delta must be an int, got {delta!r}")
        return [MAGIC + bytes([INT_CODEC]), HEADER.size, delta]

    @staticmethod
    def _incr_result(keys: Keys, reply: list[Any]) -> int | None:
        status = int(reply[0])
        if status == 1:
            return int(reply[1])
        if status == 0:
            return None
        if status == -1:
            raise TypeError(f"the value of key {keys.name!r} is not an integer")
        raise OverflowError(f"incrementing key {keys.name!r} leaves the 64-bit integer range")

    def _items(self, mapping: Mapping[Any, Any]) -> list[tuple[Keys, Any]]:
        if not isinstance(mapping, Mapping):
            raise ConfigurationError(f"mapping must be a Mapping of keys to values, got {mapping!r}")
        return [(self._keys(key), value) for key, value in mapping.items()]

    def _many(self, keys: Iterable[str | bytes]) -> dict[bytes, tuple[str | bytes, Keys]]:
        named: dict[bytes, tuple[str | bytes, Keys]] = {}
        for key in keys:
            names = self._keys(key)
            named[names.value] = (key, names)
        return named

    def _found_many(self, named: dict[bytes, tuple[str | bytes, Keys]], raws: list[Any]) -> dict[Any, Any]:
        found = {}
        for (key, names), raw in zip(named.values(), raws, strict=True):
            entry = self._decode(names, raw if isinstance(raw, bytes) else None)
            if entry is not None:
                found[key] = entry.value
        return found

    def _wrote(self, script: str, *written: Keys) -> None:
        """After ``script`` ran on ``written``: the outcomes of flights of
        those keys that were under way are not shared after it (see
        ``Flight.overtaken``)."""
        if script in _WRITES:
            near = self._near
            for keys in written:
                value = keys.value
                self._busy.forget(value)
                if near is not None:
                    near.invalidate([value])  # this process sees its own write at once
                self._flights.overtake(value, (value, "read"), (value, "after-wait"))

    @staticmethod
    def _unlink_plan(names: list[bytes]) -> tuple[list[bytes], list[bytes], list[Keys]]:
        """Sort names that ``SCAN`` found under this namespace for deletion:
        values and other keys to unlink, and keys whose rebuild is under way
        (they have a lease) to delete as ``delete`` does, leaving a fence, so
        that rebuild cannot store what it read before. Fences are left to
        expire: deleting one would let such a commit through."""
        leased = {name[:-6] for name in names if name.endswith(b":lease")}
        values = [name for name in names if name.endswith(b"}") and name not in leased]
        others = [name for name in names if not name.endswith((b"}", b":lease", b":fence"))]
        fenced = [Keys(value.decode("utf-8", "backslashreplace"), value) for value in sorted(leased)]
        return values, others, fenced

    def _queue_scripts(
        self, pipe: Any, script: str, calls: list[tuple[Keys, list[Any]]], *, by_source: bool
    ) -> None:
        """Queue ``script`` once per call on ``pipe``: EVALSHA, or EVAL with ``by_source``.

        EVAL is for calls that got NOSCRIPT: the scripts were flushed (SCRIPT
        FLUSH, a restart, a failover) between redis-py's SCRIPT LOAD and the
        EVALSHAs, and could be again; a script sent whole cannot be missing.
        """
        registered = self._scripts[script]
        if not by_source:
            pipe.scripts.add(registered)  # what redis-py's SCRIPT LOAD before EVALSHA works from
        for names, args in calls:
            # Queuing is synchronous on redis-py's sync and asyncio pipelines alike.
            if by_source:
                pipe.eval(registered.script, len(names.script_keys), *names.script_keys, *args)
            else:
                pipe.evalsha(registered.sha, len(names.script_keys), *names.script_keys, *args)

    @staticmethod
    def _unscripted(results: list[Any]) -> list[int]:
        """The positions of pipelined calls that got NOSCRIPT, so never ran."""
        return [i for i, result in enumerate(results) if isinstance(result, redis.exceptions.NoScriptError)]

    @staticmethod
    def _pipeline_results(results: list[Any], again: list[int], retried: list[Any]) -> list[Any]:
        """``results`` with the calls run again put back; raises the first error."""
        for i, result in zip(again, retried, strict=True):
            results[i] = result
        for result in results:
            if isinstance(result, Exception):
                raise result
        return results

    def _lease_for(self, keys: Keys, options: Options, flow: Flow, paused: Paused) -> Read:
        if paused.token is None:  # no lease to hand out (fail-open, or gave up waiting)
            return Read(False)
        clock = self._clock
        lease = Lease(keys, paused.token, flow, options, clock.monotonic(), flow.won_at)
        return Read(False, None, lease, paused.stale)

    def _settle_options(self, lease: Lease, ttl: Any, stale_ttl: Any) -> Options:
        """The lease's options, with the committer's ``ttl``/``stale_ttl`` if given."""
        given = {
            name: value for name, value in (("ttl", ttl), ("stale_ttl", stale_ttl)) if value is not UNSET
        }
        options = lease._options.merged(given) if given else lease._options
        lease._flow.options = options
        return options

    def _rebuilt_by_holder(self, lease: Lease, value: Any) -> Rebuilt:
        if not isinstance(lease, Lease):
            raise ConfigurationError(f"lease must be a stampede.Lease from read(), got {lease!r}")
        return Rebuilt(value, None, self._clock.monotonic() - lease._started)

    def _op_call(self, op: Acquire | Commit | Release, keys: Keys, options: Options) -> tuple[str, list[Any]]:
        """The script and arguments that carry out a lease operation."""
        if isinstance(op, Acquire):
            return "acquire", [op.token, options.lease_ms]
        if isinstance(op, Commit):
            since = "" if op.won_at is None else op.won_at
            magic = self._codec.magic
            args = [op.token, op.data, options.expire_ms or 0, keys.channel, since, magic, options.lapse_ms]
            return "commit", args
        return "release", [op.token, keys.channel, CANCELLED if op.retake else RELEASED]

    @staticmethod
    def _op_result(op: Acquire | Commit | Release, reply: Any) -> Any:
        if isinstance(op, Acquire):
            if reply[0]:
                won_at = reply[2]
                return Acquired(
                    True, reply[1], won_at=won_at.decode() if isinstance(won_at, bytes) else won_at
                )
            return Acquired(False, lease_pttl=int(reply[1]))
        if isinstance(op, Commit):
            if isinstance(reply, list):
                return Refused(reply[1] if len(reply) > 1 else None)
            return True
        return None
