"""What a process remembers of other callers' leases for a moment, so that
its next callers need not ask Redis again: the keys another caller refreshes
(:class:`BusyLeases`) and the keys that reads do not fill (:class:`UnfilledKeys`)."""

from __future__ import annotations

from typing import Any

from .envelope import Entry
from .near import NearStore

__all__ = ["BUSY_MEMO_SECONDS", "MOST_REMEMBERED", "BusyLeases", "FailedKeys", "KeptAlone", "UnfilledKeys"]


#: The longest a process trusts that another holds a key's lease without
#: asking Redis again: a holder that gave up without a value is noticed
#: within this, where the lease's own expiry could be seconds away.
BUSY_MEMO_SECONDS = 0.25
#: The most names a memo holds: past it, it forgets them all (forgetting only
#: costs a request to Redis).
MOST_REMEMBERED = 4096
#: A memo sweeps out its expired names once it holds twice as many as after
#: its last sweep, and this many at least: the sweeps cost O(1) a note.
FIRST_SWEEP = 64


class _Moments:
    """Names remembered for a moment: each with a time (monotonic) past which
    it is forgotten, and what was found. Names whose time passed are swept
    out as the memo grows, so that a process reading ever new keys holds
    only those of the last moment. Thread-safe enough: each step is one dict
    operation (a note racing a sweep may be lost: a request to Redis)."""

    __slots__ = ("_sweep_at", "_until")

    def __init__(self) -> None:
        self._until: dict[bytes, tuple[float, Any]] = {}
        self._sweep_at = FIRST_SWEEP

    def _recall(self, name: bytes, now: float) -> tuple[float, Any] | None:
        found = self._until.get(name)
        return found if found is not None and now < found[0] else None

    def _remember(self, name: bytes, now: float, seconds: float, found: Any) -> None:
        if len(self._until) >= self._sweep_at:
            self._sweep(now)
        self._until[name] = (now + min(seconds, BUSY_MEMO_SECONDS), found)

    def _sweep(self, now: float) -> None:
        live = {name: found for name, found in self._until.items() if now < found[0]}
        if len(live) >= MOST_REMEMBERED:
            live = {}
        self._until = live
        self._sweep_at = max(FIRST_SWEEP, 2 * len(live))

    def __len__(self) -> int:
        return len(self._until)

    def forget(self, name: bytes) -> None:
        """A write of this process (or a lease it won): ask Redis again next time."""
        self._until.pop(name, None)


class BusyLeases(_Moments):
    """Per process: the keys whose lease another caller was found to hold, and
    until when. While a stale key is being refreshed elsewhere, the process's
    next readers serve the stale value without asking for the lease again:
    one ``GET`` per request, not a ``GET`` and a lease request."""

    __slots__ = ()

    def held(self, name: bytes, now: float, stale: Entry) -> bool:
        """Whether the lease on ``name`` was found held, and may still be, at
        ``now``, by a caller refreshing this same ``stale`` value (not an older one)."""
        found = self._recall(name, now)
        return found is not None and found[1] == stale.created_at

    def note(self, name: bytes, now: float, lease_pttl_ms: int, stale: Entry) -> None:
        """The lease on ``name`` was found held, ``lease_pttl_ms`` from its
        expiry, while ``stale`` was the value to refresh."""
        if lease_pttl_ms > 0:
            self._remember(name, now, lease_pttl_ms / 1000, stale.created_at)


class UnfilledKeys(_Moments):
    """Per process: the missing keys a read found marked as ones that reads do
    not fill (see ``scripts.UNFILLED``), and until when. A read that finds
    such a key missing again misses at once, without asking for the lease:
    one ``GET`` per read, as for a stock cache. A write of the key by this
    process forgets it; another process's write shows in the ``GET``."""

    __slots__ = ()

    def known(self, name: bytes, now: float) -> bool:
        """Whether ``name`` was found marked, and may still be, at ``now``."""
        return self._recall(name, now) is not None

    def note(self, name: bytes, now: float, mark_pttl_ms: int) -> None:
        """``name`` was found marked, ``mark_pttl_ms`` from the mark's expiry."""
        if mark_pttl_ms > 0:
            self._remember(name, now, mark_pttl_ms / 1000, None)


class FailedKeys(_Moments):
    """Per process: the missing keys whose last rebuild raised, found so in
    their lease (see ``scripts.FAILED``), with what it said and until when.
    A caller with nothing in hand is told so at once, without asking Redis,
    for a moment (:data:`BUSY_MEMO_SECONDS` at most: another process's write
    ends the back-off). A write of the key by this process forgets it;
    another process's write shows in the ``GET``."""

    __slots__ = ()

    def known(self, name: bytes, now: float) -> tuple[float, Any] | None:
        """``(until, what the lease said)`` if ``name`` was found failed and may still be."""
        return self._recall(name, now)

    def note(self, name: bytes, now: float, retry_in_ms: int, said: Any) -> None:
        """``name``'s lease said ``said`` (its ``Acquired``), ``retry_in_ms`` before a new try."""
        if retry_in_ms > 0:
            self._remember(name, now, retry_in_ms / 1000, said)


#: The most values :class:`KeptAlone` holds, and the longest it keeps one (s).
MOST_KEPT = 1024
LONGEST_KEPT = 300.0


#: Seconds after Redis answers again during which the callers its breaker
#: turned away just before are served what was kept (see :meth:`KeptAlone.get`).
TURNED_AWAY_GRACE = 1.0


class KeptAlone:
    """Per process: the values rebuilt or written while Redis was away
    (under ``fail_open``), kept for their ``ttl`` (:data:`LONGEST_KEPT` at
    most) and served only while Redis still fails, so that a process rebuilds
    a key once per window during an outage, not once per call. At most
    :data:`MOST_KEPT`, the oldest dropped first. A write of the key that
    Redis takes, or a delete or invalidation by this process, drops it (a
    tag's: all of them), and all are dropped once Redis answers again, but
    for the callers the breaker turned away just before (see :meth:`get`).
    Thread-safe enough: each step is one dict operation."""

    __slots__ = ("_kept", "_near", "_turned_away")

    def __init__(self, near: NearStore | None = None) -> None:
        self._kept: dict[bytes, tuple[float, Any]] = {}
        #: What was kept when Redis answered again: for the callers that the
        #: breaker had turned away just before it closed (see :meth:`let_go`).
        self._turned_away: dict[bytes, tuple[float, Any]] = {}
        self._near = near

    def keep(self, name: bytes, value: Any, now: float, ttl: float | None) -> None:
        kept = self._kept
        kept.pop(name, None)
        if len(kept) >= MOST_KEPT:
            kept.pop(next(iter(kept)), None)
        kept[name] = (now + min(LONGEST_KEPT if ttl is None else ttl, LONGEST_KEPT), value)

    def get(self, name: bytes, now: float, *, skipped: bool = False) -> tuple[bool, Any]:
        """``(True, value)`` if ``name``'s value is kept, else ``(False, None)``.

        ``skipped``: the caller's command was not sent, the breaker being
        open. Such a caller may find the breaker closed, and what was kept
        dropped, by the time it looks (the probe was answered meanwhile): it
        is served what was kept, as it would have been a moment earlier,
        rather than rebuild beside the caller now rebuilding through Redis."""
        found = self._kept.get(name)
        if found is None and skipped:
            found = self._turned_away.get(name)
        if found is None or now >= found[0]:
            return False, None
        return True, found[1]

    def copy(self, name: bytes) -> bytes | None:
        """The near copy of ``name`` held since the near cache lost its
        invalidation connection (see ``NearStore.held_away``), if any."""
        return None if self._near is None else self._near.held_away(name)

    def __len__(self) -> int:
        return len(self._kept) + len(self._turned_away)

    def forget(self, name: bytes) -> None:
        self._kept.pop(name, None)
        self._turned_away.pop(name, None)

    def clear(self) -> None:
        """A removal covered them all."""
        self._kept = {}
        self._turned_away = {}

    def let_go(self) -> None:
        """What was kept when Redis last answered is served to nobody: the
        callers turned away before it did have had their moment (their
        breaker's prober waits :data:`TURNED_AWAY_GRACE` after the answer),
        or Redis failed again (what it said since is newer)."""
        self._turned_away = {}

    def answered(self) -> None:
        """Redis answers again: nothing kept, nor any near copy held, is served
        (but to the callers turned away before it did: see :meth:`get`)."""
        self._turned_away, self._kept = self._kept, {}
        if self._near is not None:
            self._near.forget_away()
