"""The stampede algorithm, written once and free of I/O.

:class:`Flow` is a generator that yields operations (:class:`Acquire`,
:class:`Rebuild`, :class:`Commit`, :class:`Release`, :class:`Wait`) and
receives their results; the sync and asyncio drivers run the same
generator, so there is one copy of the logic, testable without Redis or a
real clock. A driver reports a failed Redis operation by throwing
:class:`~stampede.RedisUnavailableError` into the generator.
"""

from __future__ import annotations

import math
import random
import secrets
import time as _time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from .._exceptions import RedisUnavailableError, SerializationError, WaitTimeoutError
from .envelope import Codec, Entry
from .events import EventKind, logger
from .keys import Keys
from .options import Options
from .tags import UNTAGGED, Captured

__all__ = [
    "CANCELLED",
    "RELEASED",
    "RELEASE_GRACE",
    "Acquire",
    "Acquired",
    "BusyLeases",
    "Capture",
    "Clock",
    "Commit",
    "Flow",
    "Lookup",
    "Op",
    "Rebuild",
    "Rebuilt",
    "Refused",
    "Release",
    "Reread",
    "Sleep",
    "Standby",
    "UnfilledKeys",
    "Wait",
    "Waited",
    "envelope_of",
    "new_token",
    "renew_interval",
    "wake_interval",
]


class Clock(Protocol):
    """Where the flow reads time: wall clock for shared timestamps, monotonic for waits."""

    def time(self) -> float: ...

    def monotonic(self) -> float: ...


class SystemClock:
    """The real clocks."""

    time = staticmethod(_time.time)
    monotonic = staticmethod(_time.monotonic)


def new_token() -> str:
    """A lease token: 128 random bits, never reused."""
    return secrets.token_hex(16)


# --- operations the flow yields, and what drivers send back ----------------


@dataclass(frozen=True, slots=True)
class Acquire:
    """Try to take the lease. Result: :class:`Acquired`.

    ``reads``: the caller is a read (``Stampede.read``), which gets no lease
    on a missing key marked as one that reads do not fill; a rebuild takes
    the lease over such a mark.
    """

    token: str
    reads: bool = False


@dataclass(frozen=True, slots=True)
class Acquired:
    """Result of :class:`Acquire`.

    ``current`` is the value key's raw bytes, read atomically with a won
    lease, and ``won_at`` the server's clock then (text); ``lease_pttl`` the
    holder's remaining milliseconds when lost; ``unfilled``: not won, the key
    being missing and marked as one that reads do not fill (see
    :attr:`Acquire.reads`).
    """

    won: bool
    current: bytes | None = None
    lease_pttl: int = -2
    won_at: str | None = None
    unfilled: bool = False


@dataclass(frozen=True, slots=True)
class Capture:
    """Read what the value about to be rebuilt records of its groups: the
    namespace's version and those of ``tags`` (ids), each tag's state kept
    alive as long as the value may be. Result: :class:`Captured`.

    ``since``: the server's clock when the lease was won, for a value whose
    data was read before this capture (a lease handed to the caller): a tag
    bumped since then is recorded so that the value is stale (or missing).
    """

    tags: tuple[bytes, ...]
    since: str | None = None


@dataclass(frozen=True, slots=True)
class Rebuild:
    """Run the rebuild function, renewing lease ``token`` (if any) meanwhile.

    Result: :class:`Rebuilt`, never an exception: the rebuild's own errors
    are data here, so they cannot be mistaken for the driver's. ``stale``:
    the value in hand meanwhile, if any (for drivers that hand the rebuild
    to their caller).
    """

    token: str | None
    stale: Entry | None = None


@dataclass(frozen=True, slots=True)
class Rebuilt:
    """Result of :class:`Rebuild`."""

    value: Any
    error: BaseException | None
    duration: float
    lease_lost: bool = False


@dataclass(frozen=True, slots=True)
class Commit:
    """Write ``data`` if ``token`` still holds the lease, release the lease
    and wake waiters. Result: ``True`` if it was written, else :class:`Refused`.

    ``won_at``: the server's clock when the lease was won; with it, also
    write if the lease lapsed with nobody else holding one and nothing was
    written, deleted or invalidated since (by the server's clock).
    """

    token: str
    data: bytes
    won_at: str | None = None


class Refused(NamedTuple):
    """What a :class:`Commit` that was not written gives: the value key's raw
    bytes, if any, which a newer write left there instead."""

    current: bytes | None = None


@dataclass(frozen=True, slots=True)
class Release:
    """Drop lease ``token`` if still ours and wake waiters. Result: None.

    Drivers never raise from it: the lease TTL is the backstop. ``detached``:
    run it in the background, retried until Redis answers (or the lease has
    expired anyway), so that a Redis that just failed us is not waited on twice.
    """

    token: str
    detached: bool = False
    #: Tell the waiters to compete for the lease (a value was rebuilt but
    #: could not be stored), rather than that its holder gave up without one
    #: (after which ``read`` callers each go on alone).
    retake: bool = False
    #: A lease a read won on a miss, whose unit of work ended without writing
    #: the key: mark the key as one that reads do not fill, for
    #: ``unfilled_ttl`` (reads of it then miss at once, leaseless).
    unfilled: bool = False


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait until a value lands, the lease is freed, or ``timeout`` passes.

    A value equal to ``unusable`` (bytes the flow already found unreadable)
    has not landed. Result: :class:`Waited`.
    """

    timeout: float
    lease_pttl: int
    unusable: bytes | None = None


class Waited(NamedTuple):
    """Result of :class:`Wait`: the value key's raw bytes if a value landed;
    ``released`` if the holder gave its lease up (announced, as opposed to
    letting it expire) without one."""

    raw: bytes | None = None
    released: bool = False


#: What the release of a lease without a value announces on the channel.
#: A commit announces ``1``; a delete, which cancels the lease, ``2``
#: (:data:`CANCELLED`), as does the release of a value that could not be stored.
RELEASED = b"0"
CANCELLED = b"2"


@dataclass(frozen=True, slots=True)
class Sleep:
    """Pause ``seconds`` before trying again. Result: None."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Reread:
    """Read the key from the primary again. Result: its raw bytes, or ``None``."""


@dataclass(frozen=True, slots=True)
class Standby:
    """Read the key from a replica, the primary having failed. Result: its raw
    bytes, or ``None`` when no replica has it or none answers (never raises)."""


Op = Acquire | Capture | Rebuild | Commit | Release | Wait | Sleep | Reread | Standby

#: The longest pause between two tries of a primary that is failing over.
FAILOVER_BACKOFF = 0.5

#: How long a waiter that found a lease gone without a value gives the
#: release announcement to arrive, to tell a release from an expiry.
RELEASE_GRACE = 0.02


def wake_interval(remaining: float, lease_pttl_ms: int, subscribed: bool) -> float:
    """How long a waiter sleeps before checking Redis itself.

    Waiters are woken by a message when a value lands or a lease is
    released; checking only guards against a holder that died (its lease
    then expires silently) and, while the subscription is not confirmed, a
    message that could have been missed. Jitter keeps waiters apart.
    """
    if not subscribed:
        return max(0.0, min(remaining, random.uniform(0.05, 0.1)))
    until_expiry = lease_pttl_ms / 1000 if lease_pttl_ms > 0 else 0.05
    return max(0.0, min(remaining, until_expiry + random.uniform(0.005, 0.05), 1.0))


def envelope_of(
    codec: Codec,
    keys: Keys,
    value: Any,
    options: Options,
    *,
    now: float,
    duration: float,
    captured: Captured = UNTAGGED,
) -> bytes:
    """The envelope of ``value`` for ``keys`` under ``options`` (its ``ttl``),
    refused with :class:`SerializationError` when the serializer fails or it is
    larger than ``max_value_size`` (before it is sent: Redis would take the
    whole of it over the wire, then refuse it)."""
    ttl = options.ttl
    try:
        data = codec.encode(
            keys.value,
            value,
            fresh_until=math.inf if ttl is None else now + ttl,
            created_at=now,
            duration=duration,
            captured=captured,
        )
    except Exception as exc:
        error = SerializationError(
            f"cannot serialize the value for key {keys.name!r} with {codec.serializer!r}: {exc}",
            key=keys.name,
        )
        error.__cause__ = exc
        raise error from exc
    limit = options.max_value_size
    if limit is not None and len(data) > limit:
        raise SerializationError(
            f"the value for key {keys.name!r} is {len(data)} bytes once serialized; max_value_size "
            f"is {limit} (raise it, or set it to None for no limit but Redis's)",
            key=keys.name,
        )
    return data


#: The longest a process trusts that another holds a key's lease without
#: asking Redis again: a holder that gave up without a value is noticed
#: within this, where the lease's own expiry could be seconds away.
BUSY_MEMO_SECONDS = 0.25


class BusyLeases:
    """Per process: the keys whose lease another caller was found to hold, and
    until when (monotonic). While a stale key is being refreshed elsewhere,
    the process's next readers serve the stale value without asking for the
    lease again: one ``GET`` per request, not a ``GET`` and a lease request."""

    __slots__ = ("_until",)

    def __init__(self) -> None:
        self._until: dict[bytes, tuple[float, float]] = {}

    def held(self, name: bytes, now: float, stale: Entry) -> bool:
        """Whether the lease on ``name`` was found held, and may still be, at
        ``now``, by a caller refreshing this same ``stale`` value (not an older one)."""
        found = self._until.get(name)
        return found is not None and now < found[0] and found[1] == stale.created_at

    def note(self, name: bytes, now: float, lease_pttl_ms: int, stale: Entry) -> None:
        """The lease on ``name`` was found held, ``lease_pttl_ms`` from its
        expiry, while ``stale`` was the value to refresh."""
        if lease_pttl_ms > 0:
            until = self._until
            if len(until) >= 4096:
                until.clear()  # a bound on memory; forgetting only costs a lease request
            until[name] = (now + min(lease_pttl_ms / 1000, BUSY_MEMO_SECONDS), stale.created_at)

    def forget(self, name: bytes) -> None:
        """A write of this process, or a lease it won: ask Redis again next time."""
        self._until.pop(name, None)


class UnfilledKeys:
    """Per process: the missing keys a read found marked as ones that reads do
    not fill (see ``scripts.UNFILLED``), and until when (monotonic). A read
    that finds such a key missing again misses at once, without asking for
    the lease: one ``GET`` per read, as for a stock cache. A write of the key
    by this process forgets it; another process's write shows in the ``GET``."""

    __slots__ = ("_until",)

    def __init__(self) -> None:
        self._until: dict[bytes, float] = {}

    def known(self, name: bytes, now: float) -> bool:
        """Whether ``name`` was found marked, and may still be, at ``now``."""
        until = self._until.get(name)
        return until is not None and now < until

    def note(self, name: bytes, now: float, mark_pttl_ms: int) -> None:
        """``name`` was found marked, ``mark_pttl_ms`` from the mark's expiry."""
        if mark_pttl_ms > 0:
            until = self._until
            if len(until) >= 4096:
                until.clear()  # a bound on memory; forgetting only costs a lease request
            until[name] = now + min(mark_pttl_ms / 1000, BUSY_MEMO_SECONDS)

    def forget(self, name: bytes) -> None:
        """A write of this process: ask Redis again next time."""
        self._until.pop(name, None)


def renew_interval(lease_ttl: float) -> float:
    """How often the watchdog renews a lease: three chances before it lapses."""
    return lease_ttl / 3


class Lookup(NamedTuple):
    """What the first read of a key found.

    ``entry`` is a readable value (due for early refresh, or stale);
    ``error`` a failed read.
    """

    entry: Entry | None
    error: RedisUnavailableError | None = None


_Outcome = tuple[Any, BaseException | None]


class Flow:
    """One ``get_or_rebuild`` call of one key, past the fresh hit.

    Args:
        keys: the Redis names of the key.
        options: the call's effective options.
        codec: encodes the rebuilt value (its serializer, its signer).
        decode: raw bytes (or ``None``) to an :class:`Entry`, ``None`` when
            missing or unreadable.
        clock: time source.
        emit: reports an event about this key.
        background: this flow runs detached; its caller was already served.
        take_over: when a lease is freed without a value, compete for it
            again (``get_or_rebuild``) rather than go on alone (``read``).
        can_wait: whether this caller may wait for someone else's rebuild;
            not on an event loop's thread, where waiting would freeze the
            loop (and the very coroutine holding the lease).
        deadline: the monotonic time at which waiting ends, if the caller
            already waited before this flow began.
        missed: this call was already reported as a miss (it waited for
            another caller of its process first).
        busy: the process's :class:`BusyLeases`, consulted before a stale
            value's lease is asked for.
        unfilled_keys: the process's :class:`UnfilledKeys`, told of a key a
            read found marked as one that reads do not fill.
        tags: the ids of the tags the rebuilt value carries.
        fails_over: the primary can be replaced (a Redis Cluster, a
            Sentinel-managed master): when it fails, a replica's value is
            served, and a caller with nothing to serve tries the primary
            again until ``wait_timeout`` (a promotion) rather than fail at once.
    """

    def __init__(
        self,
        keys: Keys,
        options: Options,
        codec: Codec,
        decode: Callable[[bytes | None], Entry | None],
        clock: Clock,
        emit: Callable[..., None],
        *,
        background: bool = False,
        take_over: bool = True,
        can_wait: bool = True,
        deadline: float | None = None,
        fails_over: bool = False,
        missed: bool = False,
        busy: BusyLeases | None = None,
        unfilled_keys: UnfilledKeys | None = None,
        tags: tuple[bytes, ...] = (),
    ) -> None:
        self.keys = keys
        self.options = options
        self.codec = codec
        self.decode = decode
        self.clock = clock
        self.emit = emit
        self.background = background
        self.take_over = take_over
        self.can_wait = can_wait
        self.deadline = deadline
        self.fails_over = fails_over
        self.missed = missed
        self.busy = busy
        self.unfilled_keys = unfilled_keys
        self.tags = tags
        #: What the value rebuilt records of its groups (see :class:`Capture`).
        self.captured = UNTAGGED
        self.committed = False  # set by settle(): whether a rebuilt value was stored
        self.won_at: str | None = None  # the server's clock when this flow won its lease
        self.unfilled = False  # found the key marked as one that reads do not fill
        # Its rebuild lost to a newer write (the commit was refused): its value
        # is for its own caller only, who asked before that write.
        self.superseded = False

    def run(self, lookup: Lookup) -> Generator[Op, Any, Any]:
        """Serve, refresh or rebuild the key; returns the value or raises."""
        try:
            if lookup.error is not None:
                found = yield from self._through_failover(lookup.error)
                if isinstance(found, Entry):
                    return found.value
                lookup = found
            if lookup.entry is not None:
                outcome = yield from self._refresh(lookup.entry)
            else:
                outcome = yield from self._fill()
        except RedisUnavailableError as exc:
            if lookup.entry is not None:
                # stale-if-error: a value in hand beats a rebuild against a sick Redis.
                logger.warning("Redis failed refreshing %r; serving its stale value: %s", self.keys.name, exc)
                outcome = (lookup.entry.value, None)
            elif not self.options.fail_open:
                raise
            else:
                logger.warning(
                    "Redis failed for %r; rebuilding without it (fail_open): %s", self.keys.name, exc
                )
                self.emit(EventKind.FAIL_OPEN, error=exc)
                rebuilt = yield Rebuild(None)
                self._report(rebuilt)
                outcome = (rebuilt.value, rebuilt.error)
        value, error = outcome
        if error is not None:
            raise error
        return value

    def _through_failover(self, error: RedisUnavailableError) -> Generator[Op, Any, Entry | Lookup]:
        """The first read failed: a replica's value to serve, or (where the
        primary can fail over) what the primary has once it answers again."""
        entry = self.decode((yield Standby()))
        if entry is not None:
            # stale-if-error from a replica: whatever it holds is no older than
            # what this caller could have had, and beats an error.
            logger.info("Redis failed reading %r; serving a replica's value: %s", self.keys.name, error)
            self.emit(EventKind.REPLICA_HIT)
            return entry
        if not self.fails_over or self.options.fail_open:
            raise error
        raw = yield from self._until_primary(Reread(), error)
        entry = self.decode(raw)
        if entry is not None and entry.is_fresh(self.clock.time()):
            self.emit(EventKind.HIT)
            return entry
        return Lookup(entry)

    def _until_primary(self, op: Op, error: RedisUnavailableError) -> Generator[Op, Any, Any]:
        """Run ``op`` until the primary answers (a failover promoted a replica),
        for at most the caller's waiting time; raise the last error after."""
        if self.deadline is None:
            self.deadline = self.clock.monotonic() + self.options.wait_timeout
        pause = 0.05
        while True:
            pause = yield from self._pause_for_failover(error, self.deadline, pause)
            try:
                return (yield op)
            except RedisUnavailableError as exc:
                error = exc

    def _pause_for_failover(
        self, error: RedisUnavailableError, deadline: float, pause: float
    ) -> Generator[Op, Any, float]:
        """After ``error``: raise it where the primary cannot fail over (or
        ``fail_open`` was chosen, or time is up); else sleep before the next
        try and return the pause after that one."""
        if not self.fails_over or self.options.fail_open or self.clock.monotonic() + pause >= deadline:
            raise error
        yield Sleep(pause)
        return min(pause * 2, FAILOVER_BACKOFF)

    def after_wait_timeout(self) -> Generator[Op, Any, Any]:
        """What a caller does once it has waited ``wait_timeout`` in vain."""
        self.emit(EventKind.WAIT_TIMEOUT)
        if self.options.on_wait_timeout == "raise":
            raise WaitTimeoutError(self.keys.name, self.options.wait_timeout)
        logger.warning(
            "waited %gs for the rebuild of %r; rebuilding it for this caller only",
            self.options.wait_timeout,
            self.keys.name,
        )
        value, error = yield from self._alone()
        if error is not None:
            raise error
        return value

    def without_waiting(self) -> Generator[Op, Any, Any]:
        """What a caller that may not wait does instead: rebuild alone, unstored."""
        value, error = yield from self._no_wait()
        if error is not None:
            raise error
        return value

    def _no_wait(self) -> Generator[Op, Any, _Outcome]:
        self.emit(EventKind.NO_WAIT)
        logger.debug("not waiting for the rebuild of %r on an event loop's thread", self.keys.name)
        return (yield from self._alone())

    def _alone(self) -> Generator[Op, Any, _Outcome]:
        # A rebuild without the lease, for this caller only. Not stored:
        # nothing fences this write, and a rebuild that read its data before
        # a newer commit (or a set, delete or invalidate) would overwrite it.
        rebuilt: Rebuilt = yield Rebuild(None)
        self._report(rebuilt)
        return rebuilt.value, rebuilt.error

    def _refresh(self, entry: Entry) -> Generator[Op, Any, _Outcome]:
        # A stale (or early-refresh) value is in hand: whoever loses the
        # lease race serves it at once.
        busy = self.busy
        name = self.keys.value
        if busy is not None and busy.held(name, self.clock.monotonic(), entry):
            # Another caller refreshes it, as this process found out moments ago.
            return self._served_stale(entry)
        token = new_token()
        acquired = yield from self._acquire(token)
        if not acquired.won:
            if busy is not None:
                busy.note(name, self.clock.monotonic(), acquired.lease_pttl, entry)
            return self._served_stale(entry)
        if busy is not None:
            busy.forget(name)
        self.emit(EventKind.LEASE_WON)
        current = self.decode(acquired.current)
        if (
            current is not None
            and current.created_at > entry.created_at
            and current.is_fresh(self.clock.time())
        ):
            # Refreshed by someone else between our read and our lease.
            yield Release(token)
            return current.value, None
        return (yield from self._rebuild_and_commit(token, entry))

    def _served_stale(self, entry: Entry) -> _Outcome:
        if not self.background:
            fresh = entry.is_fresh(self.clock.time())
            self.emit(EventKind.HIT if fresh else EventKind.STALE_HIT)
        return entry.value, None

    def _fill(self) -> Generator[Op, Any, _Outcome]:
        # Nothing to serve: one caller rebuilds, the others wait for it.
        if not self.missed:
            self.emit(EventKind.MISS)
            self.missed = True
        clock = self.clock
        deadline = self.deadline
        if deadline is None:
            deadline = clock.monotonic() + self.options.wait_timeout
        unusable: bytes | None = None
        pause = 0.05  # between tries of a primary that is failing over
        while True:
            token = new_token()
            try:
                acquired = yield from self._acquire(token)
            except RedisUnavailableError as exc:
                pause = yield from self._pause_for_failover(exc, deadline, pause)
                continue
            if acquired.unfilled:
                # A key that reads do not fill (nobody wrote it after the last
                # read that took its lease): a miss at once, for this caller alone.
                self.emit(EventKind.UNFILLED)
                self.unfilled = True
                if self.unfilled_keys is not None:
                    self.unfilled_keys.note(self.keys.value, clock.monotonic(), acquired.lease_pttl)
                return (yield from self._alone())
            if acquired.won:
                self.emit(EventKind.LEASE_WON)
                landed = self.decode(acquired.current)
                if landed is not None and landed.is_fresh(clock.time()):
                    # A rebuild landed between our read and our lease.
                    yield Release(token)
                    return landed.value, None
                return (yield from self._rebuild_and_commit(token, landed))
            self.emit(EventKind.LEASE_BUSY)
            if not self.can_wait:
                return (yield from self._no_wait())
            remaining = deadline - clock.monotonic()
            if remaining > 0:
                started = clock.monotonic()
                try:
                    waited: Waited = yield Wait(remaining, acquired.lease_pttl, unusable)
                except RedisUnavailableError as exc:
                    pause = yield from self._pause_for_failover(exc, deadline, pause)
                    continue
                self.emit(EventKind.WAIT, duration=clock.monotonic() - started)
                landed = self.decode(waited.raw)
                if landed is not None:
                    return landed.value, None
                unusable = waited.raw  # foreign bytes: wait for them to change, do not spin
                if clock.monotonic() < deadline:
                    if self.take_over or not waited.released:
                        continue  # freed without a value (or expired): try to take it
                    # The holder gave up without a value: each caller goes on
                    # alone rather than queue for the lease one at a time
                    # (a key that is normally absent must not serialise them).
                    return (yield from self._alone())
            try:
                value = yield from self.after_wait_timeout()
            except WaitTimeoutError as exc:
                return None, exc
            return value, None

    def _report(self, rebuilt: Rebuilt) -> None:
        if rebuilt.lease_lost:
            logger.warning("lost the lease on %r while rebuilding it", self.keys.name)
            self.emit(EventKind.LEASE_LOST)
        if rebuilt.error is None:
            self.emit(EventKind.REBUILD, duration=rebuilt.duration)
        elif isinstance(rebuilt.error, Exception):  # not a cancellation or interrupt
            self.emit(EventKind.REBUILD_ERROR, duration=rebuilt.duration, error=rebuilt.error)

    def _acquire(self, token: str) -> Generator[Op, Any, Acquired]:
        try:
            acquired: Acquired = yield Acquire(token, reads=not self.take_over)
        except BaseException:
            # The lease may have been granted although its reply never came
            # (a lost connection, a cancelled caller): drop it if it is ours
            # rather than leave it to block others until it expires. In the
            # background: the Redis that just failed must not stall us twice.
            yield Release(token, detached=True)
            raise
        if acquired.won:
            self.won_at = acquired.won_at
        return acquired

    def _rebuild_and_commit(self, token: str, stale: Entry | None) -> Generator[Op, Any, _Outcome]:
        try:
            # Before the rebuild reads its data: an invalidation of its tags
            # from now on leaves the value it stores stale.
            self.captured = yield Capture(self.tags)
        except BaseException:
            yield Release(token, detached=True)
            raise
        rebuilt: Rebuilt = yield Rebuild(token, stale)
        # Fenced by the server's clock rather than by holding the lease, so
        # that a lease evicted (maxmemory) or lapsed with nothing newer
        # written meanwhile does not throw the rebuild away.
        return (yield from self.settle(token, rebuilt, stale, self.won_at))

    def settle(
        self, token: str, rebuilt: Rebuilt, stale: Entry | None = None, won_at: str | None = None
    ) -> Generator[Op, Any, _Outcome]:
        """Store what the lease holder rebuilt (fenced), or free the lease if it failed.

        Returns ``(value, error)`` for the holder's caller; records in
        :attr:`committed` whether the value was stored. Also what a split
        lease (``Stampede.read`` then ``commit``) runs when it is committed.
        """
        name = self.keys.name
        self._report(rebuilt)
        if rebuilt.error is not None:
            yield Release(token)
            if not isinstance(rebuilt.error, Exception):
                return None, rebuilt.error  # cancelled or interrupted: nothing to serve
            if stale is not None:
                logger.warning("rebuild of %r raised; serving its stale value", name, exc_info=rebuilt.error)
                return stale.value, None
            return None, rebuilt.error
        try:
            data = self._encode(rebuilt)
        except SerializationError as exc:
            yield Release(token)
            return None, exc
        try:
            outcome = yield from self._commit(Commit(token, data, won_at))
        except RedisUnavailableError as exc:
            # It could not be stored. Handing the caller a value Redis does
            # not have would let it be served an older one next: serve what
            # Redis has (the stale value), or fail, unless the user chose
            # fail_open (availability over that guarantee).
            yield Release(token, detached=True, retake=True)
            self.emit(EventKind.COMMIT_FAILED, error=exc)
            if stale is not None:
                logger.warning("could not store the rebuilt %r (%s); serving its stale value", name, exc)
                return stale.value, None
            if self.options.fail_open:
                logger.warning("could not store the rebuilt %r (%s); serving it (fail_open)", name, exc)
                return rebuilt.value, None
            return None, exc
        self.committed = outcome is True
        if not self.committed:
            logger.info("rebuilt %r but its lease had passed on; the newer value stays", name)
            self.emit(EventKind.COMMIT_REJECTED)
            self.superseded = True
            # A newer write refused it. Serve what that write left, even a
            # stale value (after an invalidate): handed this unstored value,
            # the caller would next be served that older one.
            newer = self.decode(outcome.current) if isinstance(outcome, Refused) else None
            if newer is not None:
                return newer.value, None
        return rebuilt.value, None

    def _commit(self, commit: Commit) -> Generator[Op, Any, bool | Refused]:
        # A commit is safe to repeat (the script recognises its own earlier
        # write), so a failed or unanswered one is tried again while the
        # lease would still be ours.
        clock = self.clock
        give_up_at = clock.monotonic() + self.options.lease_ttl
        delay = 0.05
        while True:
            try:
                committed: bool | Refused = yield commit
            except RedisUnavailableError:
                if clock.monotonic() + delay >= give_up_at:
                    raise
                yield Sleep(delay)
                delay = min(delay * 2, 0.5)
                continue
            return committed

    def _encode(self, rebuilt: Rebuilt) -> bytes:
        return envelope_of(
            self.codec,
            self.keys,
            rebuilt.value,
            self.options,
            now=self.clock.time(),
            duration=rebuilt.duration,
            captured=self.captured,
        )
