"""What a process remembers of other callers' leases for a moment, so that
its next callers need not ask Redis again: the keys another caller refreshes
(:class:`BusyLeases`) and the keys that reads do not fill (:class:`UnfilledKeys`)."""

from __future__ import annotations

from .envelope import Entry

__all__ = ["BUSY_MEMO_SECONDS", "BusyLeases", "UnfilledKeys"]


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
