"""The leases one unit of work holds: :class:`LeaseScope`."""

from __future__ import annotations

from typing import Any

from .lease import Lease

__all__ = ["LeaseScope"]


def _raw(key: str | bytes) -> bytes:
    # As the key space reads a key: a str and its UTF-8 bytes name one key.
    return key.encode("utf-8", "surrogatepass") if isinstance(key, str) else bytes(key)


class LeaseScope:
    """The leases one unit of work (a request, a task, a job) holds, for
    cache APIs where a read that misses is followed by the caller's own
    write (``get``, compute, ``set``).

    ``stampede.read(key, scope=scope)`` that misses and wins the key's lease
    leaves the lease here: while the scope is open, it is renewed every
    ``lease_ttl / 3`` (with ``renew``, up to ``max_lease_time``), so a unit of
    work slower than ``lease_ttl`` keeps it; :meth:`take` hands it to the
    write that follows (``commit(lease, value, store_if_lapsed=True)``); a
    second read of the key by the same reader (task or thread), before any
    write, gives it back; another reader of the unit gets a miss at once.
    When the unit ends, ``stampede.settle(scope)`` (or leaving
    ``stampede.lease_scope()``) gives back the leases left: the waiters are
    woken at once, and a key its reader found missing is remembered
    (``unfilled_ttl``) as one that reads do not fill, so later reads of it
    miss at once instead of taking a lease. A unit of work that failed (:attr:`failed`)
    gives its leases back without that mark. Should the process die, its
    leases lapse within ``lease_ttl``.

    Not bound to a flavour: a lease taken by the asyncio instance may be
    settled by the blocking one of the same namespace and Redis, and the
    reverse. One unit of work uses it; its threads and tasks may share it.
    """

    __slots__ = ("_held", "failed", "renew")

    def __init__(self, *, renew: bool = True) -> None:
        #: Whether the leases held are renewed while the scope is open:
        #: ``False`` for a unit of work with no known end (a thread's own
        #: reads), whose leases then live ``lease_ttl`` at most.
        self.renew = renew
        #: The unit of work failed (raised): its leases are given back
        #: without marking their keys as ones that reads do not fill.
        self.failed = False
        # Each lease held, by namespace and key, with who read it (a task or a thread).
        self._held: dict[tuple[str, bytes], tuple[Lease, object]] = {}

    def holds(self, stampede: Any, key: str | bytes) -> bool:
        """Whether this scope holds the lease on ``key`` of ``stampede`` (an
        instance of either flavour)."""
        return bool(self._held) and (stampede.namespace, _raw(key)) in self._held

    def take(self, stampede: Any, key: str | bytes) -> Lease | None:
        """Remove and return the lease this scope holds on ``key`` of
        ``stampede``, if any, no longer renewed: for the write that settles it
        at once (``commit``, or ``release``; a ``set`` or ``delete`` of the key
        cancels it in Redis). Left unsettled, it lapses within ``lease_ttl``."""
        return self._take(stampede.namespace, key)

    def leases(self) -> list[Lease]:
        """The leases held, of every instance."""
        return [lease for lease, _ in self._held.values()]

    def __len__(self) -> int:
        return len(self._held)

    def __repr__(self) -> str:
        return f"<LeaseScope holding {len(self._held)} lease(s)>"

    # --- for the drivers --------------------------------------------------------

    def _hold(self, namespace: str, key: str | bytes, lease: Lease, reader: object) -> None:
        self._held[namespace, _raw(key)] = (lease, reader)

    def _reader(self, namespace: str, key: str | bytes) -> object | None:
        """Who read the key whose lease is held (``None``: none is)."""
        held = self._held.get((namespace, _raw(key)))
        return None if held is None else held[1]

    def _take(self, namespace: str, key: str | bytes) -> Lease | None:
        if not self._held:
            return None
        held = self._held.pop((namespace, _raw(key)), None)
        if held is None:
            return None
        held[0]._stop_renewing()
        return held[0]

    def _drain(self, namespace: str) -> list[Lease]:
        """Remove and return the leases held of ``namespace``, no longer renewed
        (all of them at once: a settling cut short leaves none renewed)."""
        held = self._held
        # list(): one step, whatever another thread of the unit does meanwhile.
        popped = [held.pop(name, None) for name in list(held) if name[0] == namespace]
        drained = [entry[0] for entry in popped if entry is not None]
        for lease in drained:
            lease._stop_renewing()
        return drained
