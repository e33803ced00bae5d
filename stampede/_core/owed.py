"""The removals an instance owes Redis: the deletes and invalidations that
Redis could not take under ``fail_open``, kept in order and sent again until
it takes them, so that an outage loses none.

A write Redis could not take is owed as an invalidation of its key: the
value it would have replaced must not be served after the outage as if it
were still the latest (served stale while one caller renders it again, it
may be). A removal of one key is sent as of when it was asked (see
:func:`as_of`): it reaches what was written by then and cancels the rebuild
whose lease was won before, while a value written since, by a process that reached Redis
first after the outage, stays. Removals are idempotent, so one owed twice
is kept once (the later), a delete of a key covers an invalidation of it
owed before, and the stronger of two on one tag wins (a ``delete_tags``
over an ``invalidate_tags``). The book is bounded: past
:data:`MOST_OWED` entries it collapses into one deletion of every entry of
the namespace (a hard bump of its state: one command), which covers them all.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from .keys import Keys
from .tags import NAMESPACE

__all__ = ["CLOCK_LEEWAY", "EVERYTHING", "MOST_OWED", "Owed", "OwedBook", "as_of"]

#: The most removals kept; past it, one deletion of the whole namespace.
MOST_OWED = 10_000

#: Seconds added to the time a removal of a key was asked (this host's
#: clock), for the server's clock to be no later: what a host whose clock
#: is up to this much behind the server's wrote before it is still removed.
CLOCK_LEEWAY = 1.0


def as_of(now: float) -> float:
    """The server time a removal of a key asked at ``now`` (this host's
    clock, while Redis is away) is sent as of."""
    return now + CLOCK_LEEWAY


class Owed(NamedTuple):
    """One removal owed to Redis.

    ``kind``: ``"delete"`` or ``"invalidate"`` (of ``keys``), ``"tags"`` (of
    the tag ``tag``: deleted if ``hard``, else invalidated), ``"prefix"``
    (:meth:`~stampede.Stampede.delete_prefix` of ``prefix``) or ``"clear"``.
    """

    kind: str
    keys: Keys | None = None
    tag: bytes = b""
    hard: bool = False
    prefix: str = ""
    #: A removal of one key: the server time it is sent as of (see :func:`as_of`).
    as_of: float | None = None

    @property
    def target(self) -> tuple[str, object]:
        """What it removes: two removals of one target are one, the stronger."""
        if self.keys is not None:
            return (self.kind, self.keys.value)
        if self.kind == "tags":
            return ("tag", self.tag)
        return (self.kind, self.prefix)

    @property
    def strength(self) -> int:
        return 1 if self.kind == "delete" or self.hard else 0


#: Everything of the namespace deleted: what a book past its bound becomes.
EVERYTHING = Owed("tags", tag=NAMESPACE, hard=True)


class OwedBook:
    """The removals owed, in the order they were made. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owed: dict[tuple[str, object], Owed] = {}
        #: Whether anything is owed: read on every call, without the lock.
        self.pending = False
        #: No try before then (monotonic): the last one Redis failed.
        self._not_before = 0.0

    def __len__(self) -> int:
        return len(self._owed)

    def owe(self, *removals: Owed) -> None:
        """Add ``removals``, after those owed already."""
        with self._lock:
            owed = self._owed
            for removal in removals:
                target = removal.target
                if removal.kind == "delete" and removal.keys is not None:
                    owed.pop(("invalidate", removal.keys.value), None)  # covered: removed by then
                kept = owed.pop(target, None)
                if kept is not None and kept.strength > removal.strength:
                    # A copy: a payment of the one kept, under way, must not
                    # count for this later one.
                    removal = kept._replace()
                owed[target] = removal  # moved to the end: after what it follows
            if len(owed) > MOST_OWED:
                owed.clear()
                owed[EVERYTHING.target] = EVERYTHING
            self.pending = bool(owed)

    def may_pay(self, now: float) -> bool:
        """Whether to try sending what is owed at ``now``."""
        return self.pending and now >= self._not_before

    def failed(self, not_before: float) -> None:
        """Redis failed a try: none before ``not_before`` (monotonic)."""
        self._not_before = not_before

    def due(self) -> list[Owed]:
        """What is owed now, oldest first."""
        with self._lock:
            return list(self._owed.values())

    def paid(self, removal: Owed) -> None:
        """``removal`` was taken by Redis (one owed since on its target stays)."""
        with self._lock:
            if self._owed.get(removal.target) is removal:
                del self._owed[removal.target]
            self.pending = bool(self._owed)

    def abandon(self) -> int:
        """Forget everything owed (the instance closes); returns how much."""
        with self._lock:
            count = len(self._owed)
            self._owed = {}
            self.pending = False
        return count

    def forked(self) -> None:
        """In a child process just forked: the parent pays what it owes."""
        self._lock = threading.Lock()
        self._owed = {}
        self.pending = False
        self._not_before = 0.0
