"""What a process remembers of other callers' leases for a moment, so that
its next callers need not ask Redis again: the keys another caller refreshes
(:class:`BusyLeases`) and the keys that reads do not fill (:class:`UnfilledKeys`)."""

from __future__ import annotations

from typing import Any

from .envelope import Entry
from .near import NearStore

__all__ = ["BUSY_MEMO_SECONDS", "BusyLeases", "FailedKeys", "KeptAlone", "UnfilledKeys"]


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


class FailedKeys:
    """Per process: the missing keys whose last rebuild raised, found so in
    their lease (see ``scripts.FAILED``), with what it said and until when
    (monotonic). A caller with nothing in hand is told so at once, without
    asking Redis, for a moment (:data:`BUSY_MEMO_SECONDS` at most: another
    process's write ends the back-off). A write of the key by this process
    forgets it; another process's write shows in the ``GET``."""

    __slots__ = ("_known",)

    def __init__(self) -> None:
        self._known: dict[bytes, tuple[float, Any]] = {}

    def known(self, name: bytes, now: float) -> tuple[float, Any] | None:
        """``(until, what the lease said)`` if ``name`` was found failed and may still be."""
        found = self._known.get(name)
        return found if found is not None and now < found[0] else None

    def note(self, name: bytes, now: float, retry_in_ms: int, said: Any) -> None:
        """``name``'s lease said ``said`` (its ``Acquired``), ``retry_in_ms`` before a new try."""
        if retry_in_ms > 0:
            known = self._known
            if len(known) >= 4096:
                known.clear()  # a bound on memory; forgetting only costs a lease request
            known[name] = (now + min(retry_in_ms / 1000, BUSY_MEMO_SECONDS), said)

    def forget(self, name: bytes) -> None:
        """A write of this process: ask Redis again next time."""
        self._known.pop(name, None)


#: The most values :class:`KeptAlone` holds, and the longest it keeps one (s).
MOST_KEPT = 1024
LONGEST_KEPT = 300.0


class KeptAlone:
    """Per process: the values rebuilt or written while Redis was away
    (under ``fail_open``), kept for their ``ttl`` (:data:`LONGEST_KEPT` at
    most) and served only while Redis still fails, so that a process rebuilds
    a key once per window during an outage, not once per call. At most
    :data:`MOST_KEPT`, the oldest dropped first. A write of the key that
    Redis takes, or a delete or invalidation by this process, drops it (a
    tag's: all of them), and all are dropped once Redis answers again.
    Thread-safe enough: each step is one dict operation."""

    __slots__ = ("_kept", "_near")

    def __init__(self, near: NearStore | None = None) -> None:
        self._kept: dict[bytes, tuple[float, Any]] = {}
        self._near = near

    def keep(self, name: bytes, value: Any, now: float, ttl: float | None) -> None:
        kept = self._kept
        kept.pop(name, None)
        if len(kept) >= MOST_KEPT:
            kept.pop(next(iter(kept)), None)
        kept[name] = (now + min(LONGEST_KEPT if ttl is None else ttl, LONGEST_KEPT), value)

    def get(self, name: bytes, now: float) -> tuple[bool, Any]:
        """``(True, value)`` if ``name``'s value is kept, else ``(False, None)``."""
        found = self._kept.get(name)
        if found is None or now >= found[0]:
            return False, None
        return True, found[1]

    def copy(self, name: bytes) -> bytes | None:
        """The near copy of ``name`` held since the near cache lost its
        invalidation connection (see ``NearStore.held_away``), if any."""
        return None if self._near is None else self._near.held_away(name)

    def __len__(self) -> int:
        return len(self._kept)

    def forget(self, name: bytes) -> None:
        self._kept.pop(name, None)

    def clear(self) -> None:
        """Redis answers again (its breaker closed), or a removal covered them."""
        self._kept = {}

    def answered(self) -> None:
        """Redis answers again: nothing kept, nor any near copy held, is served."""
        self._kept = {}
        if self._near is not None:
            self._near.forget_away()
