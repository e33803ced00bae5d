"""Groups of entries: tags, and the namespace as a whole, invalidated in O(1).

Each tag has a state key in Redis, ``<namespace>:{<tag>}:tag`` (its own hash
tag: tags spread over a cluster's nodes like keys), holding two versions and
a time as text, ``b"<current>:<deleted>:<bumped at>"``. An entry records, for the namespace and for
each tag it carries, the tag's current version when its rebuild began (its
*capture*). Read later, against the versions the tag has then:

- every recorded version still current: the entry is as fresh as its ttl says;
- one below its tag's *deleted* version: the entry reads as missing
  (``delete_tags``: one caller rebuilds, the others wait);
- otherwise (one below its tag's *current*): the entry is stale
  (``invalidate_tags``: served stale while one caller refreshes it).

So a rebuild that read its data before an invalidation stores an entry that
is stale at once: versions are compared, clocks never. A version is the
server's clock in milliseconds, raised by at least one at each bump, so a
state key that was lost (evicted, deleted) and made again starts above every
version recorded before it.

The namespace is the tag ``""`` (key ``<namespace>:{}:tag``; no key is
empty, so no value shares it), carried by every entry: ``invalidate_all``.
Its key never expires; it is made by the first rebuild that finds it
missing. A tag's key is made or extended by every capture to outlive the
entries that record it (``ttl + stale_ttl + stale_if_error + lease_ttl``),
and no longer: a tag nobody captures leaves nothing behind.

The absence of a state is never read as the absence of an invalidation: a
state key that is missing (evicted under ``maxmemory``, expired, deleted by
``clear``) or foreign makes every entry that records it read as missing, and
the state made again knows nothing of before (every version recorded earlier
is below its deleted version). Losing a state costs a rebuild of each entry
that carries it, never a value served that should not be.

Processes keep the states they read for ``tag_check_interval`` seconds (the
bound on how late another process's invalidation is seen); with a near cache,
Redis also tells them of each change (tracking), and the state is dropped at
once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from .._exceptions import ConfigurationError

__all__ = [
    "DELETED",
    "FRESH",
    "LOST",
    "MAX_TAGS",
    "NAMESPACE",
    "STALE",
    "SUFFIX",
    "Captured",
    "History",
    "TagStates",
    "TagsUnknown",
    "bumped_at",
    "made_at",
    "microseconds",
    "parse_state",
    "tag_deleted_at",
    "tag_ids",
    "versions_for",
]

#: The most tags one entry may carry, and the longest a tag may be (UTF-8 bytes).
MAX_TAGS = 64
MAX_TAG_BYTES = 200
#: The namespace's own tag id.
NAMESPACE = b""
#: What a state key's name ends with, after the tag's ``}``.
SUFFIX = b"}:tag"

#: Verdicts on an entry's recorded versions.
FRESH, STALE, DELETED = 0, 1, 2

#: The state of a tag (or the namespace) whose key is missing or foreign:
#: nothing recorded equals it and everything is below its deleted version, so
#: an entry carrying it reads as missing, until the reader has made the state
#: again, knowing nothing of before.
LOST = (-1, 1 << 62)
_MAX_STATES = 10_000
_NOT_READ = (0, 0, float("-inf"), False)
#: While Redis fails to answer for a state, how often it is asked again at least.
_RETRY_AFTER_FAILURE = 0.1
#: Seconds the namespace's state is trusted past its lapse by the reply of a GET sent before it
#: (see ``TagStates.namespace_as_sent``): long enough for the caller to judge what it brought.
_AS_SENT_GRACE = 0.02


class Captured(NamedTuple):
    """The versions an entry records: the namespace's, and each tag's by id."""

    namespace: int
    tags: tuple[tuple[bytes, int], ...] = ()


#: What an entry records before its capture (a value never stored so): as
#: old as can be, so it reads as missing should it be.
UNTAGGED = Captured(0)


class TagsUnknown(Exception):
    """Internal: an entry's verdict needs the state of these tag ids, which
    this process has not read lately."""

    def __init__(self, ids: tuple[bytes, ...]) -> None:
        super().__init__(ids)
        self.ids = ids


def _escape(raw: bytes) -> bytes:
    if b"}" in raw or b"%" in raw:
        return raw.replace(b"%", b"%25").replace(b"}", b"%7D")
    return raw


def tag_id(tag: object, argument: str = "tags") -> bytes:
    """The id of ``tag`` (its UTF-8 name, escaped as keys are), or a
    :class:`~stampede.ConfigurationError` naming ``argument``."""
    if not isinstance(tag, str):
        raise ConfigurationError(
            f"{argument}: each tag must be a str, got {type(tag).__name__} {tag!r}", field="tags"
        )
    if not tag:
        raise ConfigurationError(f"{argument}: a tag must not be empty", field="tags")
    raw = tag.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_TAG_BYTES:
        raise ConfigurationError(
            f"{argument}: tag {tag[:40]!r}... is {len(raw)} bytes long; the limit is {MAX_TAG_BYTES}",
            field="tags",
        )
    return _escape(raw)


def tag_ids(tags: Any, argument: str = "tags") -> tuple[bytes, ...]:
    """The ids of ``tags`` (a list, tuple or set of str), without repeats, in order."""
    if isinstance(tags, (str, bytes)) or not isinstance(tags, Iterable):
        raise ConfigurationError(
            f"{argument} must be a list or tuple of str, got {type(tags).__name__} {tags!r}"
            + (f" (one tag: {argument}=[{tags!r}])" if isinstance(tags, str) else ""),
            field="tags",
        )
    ids = tuple(dict.fromkeys(tag_id(tag, argument) for tag in tags))
    if len(ids) > MAX_TAGS:
        raise ConfigurationError(
            f"{argument}: an entry carries at most {MAX_TAGS} tags, got {len(ids)}", field="tags"
        )
    return ids


def _fields(raw: Any) -> list[int] | None:
    """A state key's fields: current, deleted, bumped at, and (made since
    they were added) made at, and, the namespace's, a tag deleted at."""
    if isinstance(raw, bytes):
        parts = raw.split(b":")
        if 3 <= len(parts) <= 5 and all(part.isdigit() for part in parts):
            return [int(part) for part in parts]
    return None


def parse_state(raw: Any, tag: bytes = b"") -> tuple[int, int]:
    """A state key's value as ``(current, deleted)``; missing or foreign: :data:`LOST`."""
    fields = _fields(raw)
    return LOST if fields is None else (fields[0], fields[1])


def bumped_at(raw: Any) -> int:
    """When a state key's tag was last invalidated or deleted (server
    microseconds), ``0`` if never (or unknown)."""
    fields = _fields(raw)
    return 0 if fields is None else fields[2]


def made_at(raw: Any) -> int:
    """When a state key was made (server microseconds); ``0`` for a state made
    before this was recorded, taken as made long ago."""
    fields = _fields(raw)
    return 0 if fields is None or len(fields) < 4 else fields[3]


def tag_deleted_at(raw: Any) -> int:
    """When a tag of the namespace whose state key this is was last deleted
    (server microseconds), ``0`` if unknown."""
    fields = _fields(raw)
    return 0 if fields is None or len(fields) < 5 else fields[4]


def microseconds(server_time: str) -> int:
    """The server's clock as a lease reports it (seconds, as text) in microseconds."""
    seconds, _, fraction = server_time.partition(".")
    return int(seconds) * 1_000_000 + int((fraction + "000000")[:6])


class History(NamedTuple):
    """What a state says of its past, for a lease won before it was read:
    when it was last bumped and when it was made (server microseconds)."""

    bumped: int
    made: int


def versions_for(
    ids: tuple[bytes, ...],
    states: dict[bytes, tuple[int, int]],
    since_us: int | None = None,
    history: dict[bytes, History] | None = None,
    deleted_since: bool = False,
) -> tuple[tuple[bytes, int], ...]:
    """What an entry records of ``states`` (read just now): each tag's current
    version; or, with ``since_us`` (the server's clock when the caller's lease
    was won, its data being read after that) and each state's ``history``, a
    version that makes the entry stale (or missing) when the tag was
    invalidated (or deleted) since. A state made since knows nothing of
    before: the entry is stale, or missing if a tag of the namespace was
    deleted since (``deleted_since``)."""
    recorded = []
    for tag in ids:
        current, deleted = states[tag]
        if since_us is not None and history is not None:
            past = history.get(tag, History(0, 0))
            # In the very microsecond the lease was won counts as after: on
            # the side of a rebuild more.
            if past.made >= since_us:
                current = deleted if current > deleted and not deleted_since else 0
            elif past.bumped >= since_us:
                # Deleted since (its version is of milliseconds): missing; else stale.
                current = 0 if deleted >= since_us // 1000 else deleted
        recorded.append((tag, current))
    return tuple(recorded)


class _Fills:
    """The GETs of one tag's state under way together (see ``TagStates.begin_fill``)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class TagStates:
    """The tag states this process read lately, by tag id: ``(current,
    deleted, until, tracked)``, ``until`` on the monotonic clock.

    Filled as the near cache is (a token taken before the ``GET`` is sent, and
    dropped by any invalidation meanwhile), so that a state filled while
    tracking is live (``tracked``) stays exact: Redis tells of its change.
    Such a state is trusted past ``until`` by reads that have just found the
    tracking connection quiet (near hits, which then send nothing to Redis);
    others trust a state until ``until`` only.
    """

    __slots__ = (
        *("_filling", "_lock", "_monotonic", "_read_until", "_states", "interval", "live", "namespace"),
        *("on_change", "prefix"),
    )

    def __init__(self, prefix: bytes, interval: float) -> None:
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 <= interval <= 60:
            raise ConfigurationError(
                f"tag_check_interval must be a number of seconds from 0 to 60, got {interval!r}",
                field="tag_check_interval",
            )
        #: What every key of the namespace starts with: tracked invalidations of
        #: names under it that end in ``}:tag`` are tag states.
        self.prefix = prefix
        self.interval = float(interval)
        # The real clock, whatever clock the instance was given: this bounds
        # how long a state read from Redis is trusted.
        self._monotonic = time.monotonic
        self._states: dict[bytes, tuple[int, int, float, bool]] = {}
        self._filling: dict[bytes, _Fills] = {}
        self._lock = threading.Lock()
        #: The namespace's state, kept apart: every read checks it.
        self.namespace: tuple[int, int, float, bool] = _NOT_READ
        self._read_until = _NOT_READ[2]  # the namespace's state known lately until, as read
        self.live = False  # tracked (see the near cache); states expire all the same
        #: Called when a state held changes (the near cache's hot index was
        #: judged by the states held).
        self.on_change: Callable[[], None] = _nothing

    def key(self, tag: bytes) -> bytes:
        """The Redis name of the state key of tag id ``tag``."""
        return self.prefix + tag + SUFFIX

    # --- verdicts -----------------------------------------------------------

    def verdict(
        self,
        namespace: int,
        tags: tuple[tuple[bytes, int], ...],
        strict: bool = True,
        tracked: bool = False,
    ) -> int:
        """:data:`FRESH`, :data:`STALE` or :data:`DELETED` for an entry that
        recorded these versions. Raises :class:`TagsUnknown` with the ids whose
        state is not known lately; not ``strict``: the states held are used
        however old (those just read, with a ``tag_check_interval`` of 0), and
        those never read count as unchanged (an entry that just landed, its
        versions read moments ago). ``tracked``: the caller just found the
        tracking connection quiet."""
        now = self._monotonic()
        tracked = tracked and self.live
        unknown: list[bytes] = []
        worst = FRESH
        state = self.namespace
        usable = now < state[2] or (tracked and state[3]) or (not strict and state is not _NOT_READ)
        if usable and (namespace <= state[0] or state[0] < 0):  # read lately, or lost
            worst = _judge(namespace, state)
        else:
            unknown.append(NAMESPACE)
        outdated: list[bytes] = []
        if namespace > state[0] >= 0 and state is not _NOT_READ:
            outdated.append(NAMESPACE)
        states = self._states
        for tag, version in tags:
            state = states.get(tag)  # type: ignore[assignment]
            if state is not None and version > state[0] and state[0] >= 0:
                # Read before the entry was written (a state this process
                # holds is older than the entry's: not a reason to find it
                # stale): it is of no use any more.
                outdated.append(tag)
                state = None  # type: ignore[assignment]
            if state is None or (now >= state[2] and not (tracked and state[3]) and strict):
                unknown.append(tag)  # not read lately
                continue
            judged = _judge(version, state)
            if judged > worst:
                worst = judged
        if unknown and strict and worst != DELETED:
            # States merely expired are kept: should Redis fail to answer for
            # them, they are what reads judge by (see prolong).
            self._forget(outdated)
            raise TagsUnknown(tuple(unknown))
        return worst

    def _forget(self, tags: list[bytes]) -> None:
        """These states are known no longer: the next strict judge of them
        asks Redis. (See :meth:`_expire`.)"""
        with self._lock:
            self._expire(tags)

    def _expire(self, tags: Iterable[bytes]) -> None:
        """Under the lock: these states are known no longer, but kept. A
        caller that read them and now judges by the states held (not
        strictly) must find what it read or newer, never nothing: a state
        missing counts as unchanged there. Dropped, another caller's forget
        between its read and its judgement would serve it a deleted entry."""
        for tag in tags:
            held = self.namespace if tag == NAMESPACE else self._states.get(tag)
            if held is None or held is _NOT_READ:
                continue
            expired = (held[0], held[1], float("-inf"), False)
            if tag == NAMESPACE:
                self.namespace = expired
            else:
                self._states[tag] = expired

    def prolong(self, ids: Iterable[bytes]) -> bool:
        """Redis failed to answer for the states of ``ids``: trust those held,
        however old, for another ``tag_check_interval`` (nobody can change a
        state while its node does not answer; a node that failed over answers
        again, and is read then). Returns whether all of them are held: a
        state never read leaves the entry's freshness unknown."""
        now = self._monotonic()
        until = now + max(self.interval, _RETRY_AFTER_FAILURE)
        held = True
        with self._lock:
            for tag in ids:
                if tag == NAMESPACE:
                    state = self.namespace
                    if state is _NOT_READ:
                        held = False
                    elif now >= state[2]:
                        self.namespace = (state[0], state[1], until, state[3])
                    continue
                found = self._states.get(tag)
                if found is None:
                    held = False
                elif now >= found[2]:
                    self._states[tag] = (found[0], found[1], until, found[3])
        return held

    def namespace_due(self, at: float) -> bool:
        """Whether the namespace's state, as last read, is no longer known
        lately at ``at`` (monotonic): a GET of an entry whose reply comes
        then asks for the state too (see ``namespace_as_sent``). Never with a
        ``tag_check_interval`` of 0: every judge then reads it itself."""
        return self.interval > 0 and at >= self._read_until

    def namespace_as_sent(self, sent: float) -> None:
        """A GET of an entry sent at ``sent`` (monotonic) came back after the
        namespace's state lapsed: if the state was read lately when the GET
        was sent, it judges what the GET brought (trusted a moment longer)
        rather than cost the caller one more round trip. Only GETs sent
        while the state was known lately do this: never a chain of them."""
        if self.interval <= 0:
            return  # every judge reads the state itself
        with self._lock:
            state = self.namespace
            now = self._monotonic()
            if state is not _NOT_READ and now >= state[2] and sent < self._read_until:
                self.namespace = (state[0], state[1], now + _AS_SENT_GRACE, state[3])

    def known(self, ids: Iterable[bytes]) -> dict[bytes, tuple[int, int]] | None:
        """The states of ``ids`` if all are known lately, else ``None``."""
        now = self._monotonic()
        found = {}
        for tag in ids:
            state = self.namespace if tag == NAMESPACE else self._states.get(tag)
            if state is None or now >= state[2]:
                return None
            found[tag] = (state[0], state[1])
        return found

    def missing(self, ids: Iterable[bytes]) -> list[bytes]:
        """Those of ``ids`` whose state is not known lately."""
        now = self._monotonic()
        states = self._states
        out = []
        for tag in ids:
            state = self.namespace if tag == NAMESPACE else states.get(tag)
            if state is None or now >= state[2]:
                out.append(tag)
        return out

    # --- filling ------------------------------------------------------------

    def tag_of(self, name: bytes) -> bytes:
        """The tag id whose state key is named ``name``."""
        return name[len(self.prefix) : -len(SUFFIX)]

    def begin_fill(self, name: bytes) -> object:
        """Before the ``GET`` of the state key ``name`` is sent: a token for
        :meth:`end_fill`. The GETs under way together share one: each reply
        is kept (a caller judges by the state its own reply brought), and a
        change Redis tells of meanwhile voids them all."""
        tag = self.tag_of(name)
        with self._lock:
            fills = self._filling.get(tag)
            if fills is None:
                fills = self._filling[tag] = _Fills()
            fills.count += 1
        return fills

    def end_fill(self, name: bytes, token: object | None, raw: Any) -> None:
        """After the ``GET``: keep the state read unless it changed meanwhile
        or a reply sent later brought a newer one."""
        tag = self.tag_of(name)
        with self._lock:
            state = parse_state(raw, tag)
            if self._ended(tag, token):
                self._keep(tag, state, self.live)
            else:
                # Voided by a change told meanwhile: not trusted as known,
                # but what its caller judges by is never older than it.
                self._keep(tag, state, False)
                self._expire((tag,))

    def drop_fill(self, name: bytes, token: object | None) -> None:
        """The ``GET`` failed or was abandoned: nothing was read, nothing is kept
        (a missing key reads as ``None`` too, and means something)."""
        with self._lock:
            self._ended(self.tag_of(name), token)

    def _ended(self, tag: bytes, token: object | None) -> bool:
        """One GET of ``tag``'s state is done; whether its token still holds. Under the lock."""
        fills = self._filling.get(tag)
        if fills is None or fills is not token:
            return False
        fills.count -= 1
        if fills.count <= 0:
            del self._filling[tag]
        return True

    def learned(self, tag: bytes, raw: Any) -> tuple[int, int]:
        """A state this process just wrote (or read with a capture): kept at
        once, for ``interval``, untracked (no token covered it: a change
        Redis told of before its reply came would be missed). GETs of it
        under way are not voided: one sent after it was read brings the same
        state or a newer one, which takes its place (versions only rise);
        voided, its caller would judge by this one, maybe older than its
        own read."""
        state = parse_state(raw, tag)
        with self._lock:
            self._keep(tag, state, False)
        return state

    def _keep(self, tag: bytes, state: tuple[int, int], tracked: bool) -> None:
        held = self.namespace if tag == NAMESPACE else self._states.get(tag)
        if state == LOST:
            # Kept as lost until the state made again is (see
            # ``AsyncGroups.read_states``, which makes it at once): meanwhile
            # the entries recording it read as missing, even to a judge that
            # takes the states held however old, and a strict one reads it
            # again. Never trusted as read lately.
            lost = (state[0], state[1], self._monotonic(), False)
            if tag == NAMESPACE:
                self.namespace = lost
            else:
                self._states[tag] = lost
            if held is not None and held is not _NOT_READ and held[0] >= 0:
                self.on_change()
            return
        if held is not None and held[0] >= 0 and (held[0] > state[0] or held[1] > state[1]):
            # A reply that overtook this one (versions only rise), however long
            # ago: what a caller judges by after its own read must never be
            # older than what it read.
            return
        kept = (state[0], state[1], self._monotonic() + self.interval, tracked)
        if tag == NAMESPACE:
            self.namespace = kept
            self._read_until = kept[2]
        else:
            states = self._states
            if len(states) >= _MAX_STATES and tag not in states:
                states.clear()  # a bound on memory; forgetting costs a read
            held = states.get(tag)
            states[tag] = kept
        if held is not None and held[:2] != kept[:2]:
            self.on_change()

    # --- what Redis tells a tracked process ---------------------------------

    def invalidate(self, names: list[bytes] | None) -> None:
        """Redis says ``names`` changed (``None``: everything, a flush)."""
        with self._lock:
            if names is None:
                self._forget_all()
                return
            for name in names:
                if name.endswith(SUFFIX):
                    tag = self.tag_of(name)
                    self._filling.pop(tag, None)
                    self._expire((tag,))

    def flush(self, *, live: bool) -> None:
        """The tracking connection was lost, or restored (``live``)."""
        with self._lock:
            self._forget_all()
            self.live = live

    def _forget_all(self) -> None:
        self._states.clear()
        self._filling.clear()
        self.namespace = _NOT_READ

    def forked(self) -> None:
        """In a child process just forked: the lock may have been held by a
        thread that did not come along."""
        self._lock = threading.Lock()
        self._forget_all()
        self.live = False


def _nothing() -> None:
    pass


def _judge(version: int, state: tuple[int, int, float, bool] | tuple[int, int]) -> int:
    current, deleted = state[0], state[1]
    if version == current:
        return FRESH
    if version < deleted:
        return DELETED
    return STALE
