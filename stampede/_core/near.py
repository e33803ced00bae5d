"""The near cache: this process's copies of recently read values.

A copy is served only while the process's invalidation connection (the
per-process subscriber, with ``CLIENT TRACKING`` on the namespace's prefix)
is live: Redis tells it of every write, delete, expiry and eviction of the
namespace's keys, and each copy is dropped when told. The store keeps the
stored bytes, not the decoded value, so each caller gets a value of its own.

Filling races with invalidation: a ``GET`` may return a value that a write
replaces before the copy is stored. So a fill registers a token before its
``GET`` is sent; an invalidation of the key (or any flush) removes the
token, and a copy is stored only if its token is still there.

A copy once served as a fresh hit is also put in the *hot index*, by the
caller's key, with its payload ready to load (verified, inflated, judged
by its tags): a hit from there is a dict lookup, two clock reads and the
unpickling (see :meth:`NearStore.serve`). It is served only while the
tracking connection was found quiet at most :data:`CHECK_SECONDS` ago;
then a read checks it again (the slower path, which reads what is pending).
Any change to a tag's or the namespace's state empties the index.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._exceptions import ConfigurationError
from .events import EventKind, logger

__all__ = ["Heartbeat", "NearCache", "NearStore", "Tracked"]

#: Seconds between the PINGs a tracking connection is sent.
HEARTBEAT_SECONDS = 0.5
#: Copies are served only while the tracking connection has answered a PING
#: sent at most this long ago: a link that stalls without closing (a
#: partition, a frozen peer) would otherwise leave them served, never told
#: of writes. The bound on staleness when the link fails silently.
SILENCE_SECONDS = 1.5
#: A PING unanswered this long: the connection is given up and opened anew.
DEAD_AFTER_SECONDS = 5.0
#: After Redis refused ``CLIENT TRACKING`` (a user whose ACL lacks it), how
#: long before it is asked again, on a new connection.
REFUSED_RETRY_SECONDS = 30.0
#: How long after the tracking connection was found quiet (nothing unread on
#: it) the hot index is served without looking again: the bound on how late
#: a read sees another process's write that had returned before it began.
CHECK_SECONDS = 0.001
#: What :meth:`NearStore.serve` returns when the hot index cannot serve.
NOT_HERE: Any = object()


@dataclass(frozen=True)
class NearCache:
    """Near cache settings: at most ``max_entries`` copies and ``max_bytes``
    of stored bytes (least recently used dropped first); values larger than
    ``max_value_bytes`` are not kept."""

    max_entries: int = 10_000
    max_bytes: int = 64 * 1024 * 1024
    max_value_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_entries", "max_bytes", "max_value_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(
                    f"near_cache {name} must be an int >= 1, got {value!r}", field=f"near_cache.{name}"
                )

    @classmethod
    def from_setting(cls, setting: Any) -> NearCache | None:
        """``None``/``False``/``0``: off; ``True``: on, with the default bounds;
        an int: that many entries; a :class:`NearCache`."""
        if setting is None or setting is False or setting == 0:
            return None
        if setting is True:
            return cls()
        if isinstance(setting, NearCache):
            return setting
        if isinstance(setting, bool) or not isinstance(setting, int):
            raise ConfigurationError(
                "near_cache must be a number of entries, True, a stampede.NearCache or None, "
                f"got {setting!r}",
                field="near_cache",
            )
        return cls(max_entries=setting)


_monotonic = time.monotonic
_MAX_ALIASES = 4  # keys of one value (str and bytes spellings): a bound, not a rule
_TAG_STATE = b"}:tag"  # what a tag state key's name ends with (see stampede._core.tags)

#: Told of what the store dropped: the event, and the value's name (``b""``
#: for a flush). Called outside the store's lock.
Report = Callable[[EventKind, bytes], None]


class Heartbeat:
    """PINGs on a tracking connection, and what their answers prove.

    The connection delivers in order: once the answer to a PING sent at
    ``t`` arrives, every invalidation Redis sent before ``t`` has arrived
    too. :attr:`confirmed` is the latest such ``t`` (monotonic).
    """

    __slots__ = ("_count", "_last_sent", "_pending", "confirmed")

    def __init__(self) -> None:
        self.confirmed = float("-inf")
        self._pending: tuple[bytes, float] | None = None
        self._last_sent = float("-inf")
        self._count = 0

    def live(self, now: float) -> None:
        """Tracking was confirmed on a new connection at ``now``."""
        self.confirmed = now
        self._pending = None
        self._last_sent = now

    def quiet(self, now: float) -> bool:
        """Whether the connection answered recently enough to serve copies."""
        return now - self.confirmed <= SILENCE_SECONDS

    def due(self, now: float) -> bytes | None:
        """The payload of the PING to send now, if one is due. Raises
        ``TimeoutError`` when the last one went unanswered too long."""
        pending = self._pending
        if pending is not None:
            if now - pending[1] > DEAD_AFTER_SECONDS:
                raise TimeoutError(f"the tracking connection answered no PING for {DEAD_AFTER_SECONDS:g} s")
            return None
        if now - self._last_sent < HEARTBEAT_SECONDS:
            return None
        self._count += 1
        payload = b"stampede-heartbeat-%d" % self._count
        self._pending = (payload, now)
        self._last_sent = now
        return payload

    def answered(self, payload: Any) -> bool:
        """A ``pong`` came with ``payload``; returns whether it was ours."""
        pending = self._pending
        if pending is None or payload != pending[0]:
            return False
        self.confirmed = pending[1]
        self._pending = None
        return True


class Copy:
    """A near copy in the hot index: its payload, ready for ``loads``."""

    __slots__ = ("aliases", "extra", "fresh_until", "hits", "loads", "payload", "raw", "seen")

    def __init__(self, raw: bytes, payload: Any, loads: Callable[[Any], Any], fresh_until: float) -> None:
        self.raw = raw  # the stored bytes it was made from
        self.payload = payload
        #: Bytes it holds beyond the stored ones (an inflated payload): counted
        #: against max_bytes too.
        self.extra = max(0, len(payload) - len(raw)) if isinstance(payload, bytes) else 0
        self.loads = loads
        self.fresh_until = fresh_until
        self.aliases: list[Any] = []  # the callers' keys it is indexed under
        self.hits = 0
        self.seen = 0  # hits when eviction last looked: more since, and it is kept


class NearStore:
    """The copies of one namespace's values in this process."""

    def __init__(
        self,
        settings: NearCache,
        prefix: bytes,
        report: Report | None = None,
        wall_clock: Callable[[], float] = time.time,
        report_hit: Callable[[Any], None] | None = None,
    ) -> None:
        self.settings = settings
        self.prefix = prefix
        self._report = report
        self._report_hit = report_hit  # told of each hit from the hot index, by the caller's key
        self._lock = threading.Lock()
        self._entries: OrderedDict[bytes, bytes] = OrderedDict()
        self._bytes = 0
        self._filling: dict[bytes, object] = {}
        #: The copies held when the invalidation connection was lost: never
        #: served as hits, only by a caller that Redis fails (see ``held_away``).
        self._away: dict[bytes, bytes] = {}
        #: Whether the invalidation connection is subscribed with tracking on
        #: this prefix: copies are kept and served only then.
        self.live = False
        self._counts = {"hits": 0, "evictions": 0, "invalidations": 0, "flushes": 0}
        #: The hot index: copies by the caller's key (see the module's docstring).
        self.hot: dict[Any, Copy] = {}
        self._copies: dict[bytes, Copy] = {}  # the same, by the value's name
        self._time = wall_clock
        #: The tracking connection's state (set when tracked).
        self.tracked = Tracked()

    @property
    def counts(self) -> dict[str, int]:
        """Hits, evictions, invalidations and flushes so far."""
        counts = dict(self._counts)
        counts["hits"] += sum(copy.hits for copy in list(self._copies.values()))
        return counts

    def serve(self, key: Any) -> Any:
        """The value of the hot copy of the caller's ``key``, a new object
        each time, if it may be served now; else :data:`NOT_HERE`. Every near
        hit but the first after a check comes here: written for speed."""
        try:
            copy = self.hot.get(key)
        except TypeError:
            return NOT_HERE  # unhashable, so no key: the caller's own checks say so
        if copy is None or _monotonic() >= self.tracked.trusted_until or self._time() >= copy.fresh_until:
            return NOT_HERE
        copy.hits += 1
        if self._report_hit is not None:
            self._report_hit(key)
        return copy.loads(copy.payload)

    def index(self, key: Any, name: bytes, raw: bytes, made: Callable[[], Copy | None]) -> None:
        """Put the copy ``raw`` of ``name``, just served as a fresh hit to a
        caller of ``key``, in the hot index: ``made()`` prepares it (``None``:
        it cannot be)."""
        if len(self.hot) >= self.settings.max_entries or self.hot.get(key) is not None:
            return
        copy = self._copies.get(name)
        if copy is None or copy.raw is not raw:
            copy = made()
            if copy is None:
                return
        settings = self.settings
        with self._lock:
            if self._entries.get(name) is not raw:
                return  # invalidated meanwhile
            known = self._copies.get(name)
            if known is None or known.raw is not raw:
                inflated = copy.extra and len(copy.payload) > settings.max_value_bytes
                if inflated or self._bytes + copy.extra > settings.max_bytes:
                    return  # inflated, it would not fit: served from the stored bytes instead
                if known is not None:
                    self._drop_copy(name)
                self._copies[name] = known = copy
                self._bytes += copy.extra
            if len(known.aliases) < _MAX_ALIASES:
                known.aliases.append(key)
                self.hot[key] = known

    def cool(self) -> None:
        """Empty the hot index: a tag's or the namespace's state changed, so
        what it was judged by no longer holds."""
        with self._lock:
            self._cool()

    def _cool(self) -> None:
        for copy in self._copies.values():
            self._counts["hits"] += copy.hits
            self._bytes -= copy.extra
        self._copies.clear()
        self.hot.clear()

    def _drop_copy(self, name: bytes) -> None:
        copy = self._copies.pop(name, None)
        if copy is not None:
            self._counts["hits"] += copy.hits
            self._bytes -= copy.extra
            hot = self.hot
            for alias in copy.aliases:
                if hot.get(alias) is copy:
                    del hot[alias]

    def get(self, name: bytes) -> bytes | None:
        if not self.live:
            return None
        with self._lock:
            raw = self._entries.get(name)
            if raw is not None:
                self._entries.move_to_end(name)
                self._counts["hits"] += 1
            return raw

    def begin_fill(self, name: bytes) -> object | None:
        """Before a ``GET`` of ``name`` is sent: a token for :meth:`end_fill`."""
        if not self.live:
            return None
        token = object()
        self._filling[name] = token
        return token

    def end_fill(self, name: bytes, token: object | None, raw: bytes | None) -> None:
        """After the ``GET``: keep ``raw`` unless ``name`` was invalidated meanwhile."""
        if token is None:
            return
        evicted: list[bytes] = []
        with self._lock:
            if self._filling.get(name) is not token:
                return  # invalidated (or flushed) since the GET was sent
            del self._filling[name]
            if raw is None or not self.live or len(raw) > self.settings.max_value_bytes:
                return
            old = self._entries.pop(name, None)
            if old is not None:
                self._bytes -= len(old)
                self._drop_copy(name)
            self._entries[name] = raw
            self._bytes += len(raw)
            settings = self.settings
            spared = 0  # hot copies given a second chance, at most one round of them
            while len(self._entries) > settings.max_entries or self._bytes > settings.max_bytes:
                dropped_name, dropped = self._entries.popitem(last=False)
                copy = self._copies.get(dropped_name)
                if copy is not None and copy.hits > copy.seen and spared < len(self._entries):
                    # Hit from the hot index since last looked at (which
                    # moves nothing to the end): used lately, so kept.
                    copy.seen = copy.hits
                    self._entries[dropped_name] = dropped
                    spared += 1
                    continue
                self._bytes -= len(dropped)
                self._drop_copy(dropped_name)
                self._counts["evictions"] += 1
                evicted.append(dropped_name)
        if evicted and self._report is not None:
            for dropped_name in evicted:
                self._report(EventKind.NEAR_EVICTION, dropped_name)

    def drop_fill(self, name: bytes, token: object | None) -> None:
        """The ``GET`` failed or was abandoned: nothing to keep."""
        if token is not None and self._filling.get(name) is token:
            self._filling.pop(name, None)

    def invalidate(self, names: list[bytes] | None) -> None:
        """Redis says ``names`` changed (``None``: everything, a flush)."""
        dropped: list[bytes] = []
        with self._lock:
            if names is None:
                flushed = self._clear()
                self._away = {}
            else:
                flushed = False
                for name in names:
                    self._away.pop(name, None)
                    self._filling.pop(name, None)
                    raw = self._entries.pop(name, None)
                    if raw is not None:
                        self._bytes -= len(raw)
                        self._drop_copy(name)
                        self._counts["invalidations"] += 1
                        dropped.append(name)
                    elif name.endswith(_TAG_STATE):
                        self._cool()  # a tag's state changed: what copies were judged by
        report = self._report
        if report is not None:
            if flushed:
                report(EventKind.NEAR_FLUSH, b"")
            for name in dropped:
                report(EventKind.NEAR_INVALIDATION, name)

    def flush(self, *, live: bool) -> None:
        """Drop every copy and fill (the connection was lost, or restored: ``live``).
        Lost, the copies are held apart: a caller that Redis fails meanwhile
        may be served one (:meth:`held_away`); restored, they are forgotten."""
        with self._lock:
            self._away = {} if live else {**self._away, **self._entries}
            flushed = self._clear()
            self.live = live
        if flushed and self._report is not None:
            self._report(EventKind.NEAR_FLUSH, b"")

    def _clear(self) -> bool:
        """Drop everything; returns whether there were copies to drop."""
        had = bool(self._entries)
        if had:
            self._counts["flushes"] += 1
        self._cool()
        self._entries.clear()
        self._filling.clear()
        self._bytes = 0
        return had

    def held_away(self, name: bytes) -> bytes | None:
        """The copy of ``name`` held since the invalidation connection was
        lost, if this process has not written or removed it since: for a
        caller that Redis fails (fail_open) to serve within its stale window,
        rather than rebuild with Redis away."""
        return self._away.get(name)

    def forget_away(self) -> None:
        """Redis answers again: it has the say on every key."""
        self._away = {}

    def forked(self) -> None:
        """In a child process just forked: nothing is known to be coherent any
        more (the connection that kept it so is the parent's), and the lock
        may have been held by a thread that did not come along."""
        self._lock = threading.Lock()
        self._cool()
        self._entries.clear()
        self._filling.clear()
        self._away = {}
        self._bytes = 0
        self.live = False

    def __len__(self) -> int:
        return len(self._entries)


class Tracked:
    """The near caches one subscriber connection keeps coherent (both
    subscribers' share of the work): which, over which connection while it
    is live, and its heartbeat."""

    __slots__ = ("_ask_from", "_refusal", "heartbeat", "link", "stores", "trusted_until")

    def __init__(self) -> None:
        self.stores: list[Any] = []  # NearStore, TagStates: a prefix, invalidate(), flush(), forked()
        self.heartbeat = Heartbeat()
        #: The tracking connection while it is live (copies are served), else None.
        self.link: Any = None
        #: Until when (monotonic) hot copies may be served: set by each check
        #: that finds the connection quiet (see CHECK_SECONDS).
        self.trusted_until = float("-inf")
        self._refusal: str | None = None  # Redis's last refusal to track, until it accepts
        self._ask_from = float("-inf")

    def quiet_at(self, now: float) -> None:
        """The connection was found quiet at ``now``: hot copies may be served
        for :data:`CHECK_SECONDS`, within the heartbeat's bound."""
        self.trusted_until = min(now + CHECK_SECONDS, self.heartbeat.confirmed + SILENCE_SECONDS)

    def may_track(self, now: float) -> bool:
        """Whether to ask Redis for tracking on a new connection at ``now``."""
        return bool(self.stores) and now >= self._ask_from

    def retry_due(self, now: float) -> bool:
        """Whether tracking was refused long enough ago to start over and ask again."""
        return self._refusal is not None and self.may_track(now)

    def refused(self, error: Exception, now: float) -> None:
        """Redis refused ``CLIENT TRACKING``: the copies stay off (every read
        asks Redis) while wake-ups go on, and it is asked again later. Said
        once per reason: an operator must see it, a log must not fill."""
        self._ask_from = now + REFUSED_RETRY_SECONDS
        reason = str(error)
        if reason != self._refusal:
            self._refusal = reason
            logger.warning(
                "near cache off: Redis refused CLIENT TRACKING (%s), so every read asks Redis. "
                "A Redis user with an ACL needs +client|id +client|tracking &__redis__:invalidate "
                "for it. Asked again every %g s.",
                reason,
                REFUSED_RETRY_SECONDS,
            )

    def accepted(self) -> None:
        """Redis accepted ``CLIENT TRACKING``."""
        if self._refusal is not None:
            self._refusal = None
            logger.info("near cache on: Redis accepted CLIENT TRACKING")

    def invalidated(self, names: list[bytes] | None) -> None:
        """Redis says ``names`` changed (``None``: everything)."""
        for store in list(self.stores):
            if names is None:
                store.invalidate(None)
            else:
                mine = [name for name in names if name.startswith(store.prefix)]
                if mine:
                    store.invalidate(mine)

    def live(self, link: Any, now: float) -> None:
        """Tracking is on and confirmed on ``link``: copies may be kept and served."""
        self.trusted_until = float("-inf")
        self.heartbeat.live(now)
        self.link = link
        for store in list(self.stores):
            store.flush(live=True)

    def dead(self) -> None:
        """The connection is gone: nothing is known to be coherent."""
        self.trusted_until = float("-inf")
        self.link = None
        for store in list(self.stores):
            store.flush(live=False)
