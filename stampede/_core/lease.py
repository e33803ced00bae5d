"""What :meth:`Stampede.read` hands out: the :class:`Read`, and with a miss the
:class:`Lease` to rebuild under."""

from __future__ import annotations

from typing import Any, NamedTuple

from .envelope import Entry
from .flow import Flow
from .keys import Keys
from .options import Options

__all__ = ["LEASE_TAKEN", "Lease", "Paused", "Read"]


#: What a ``read`` flight tells the callers that joined it when its leader
#: took the lease: wait (in the next flight) for that caller's commit.
LEASE_TAKEN: Any = object()


class Read(NamedTuple):
    """What :meth:`Stampede.read` found.

    ``found`` tells a stored value (possibly ``None``) from a miss. On a
    miss, ``lease`` is set when this caller won the right to rebuild: it
    must pass the value to ``commit(lease, value)`` or give the lease up
    with ``release(lease)``; otherwise the lease lapses after ``lease_ttl``.
    ``stale`` is then the stale :class:`Entry` the others are served, if
    any: what to answer with while refreshing in the background.
    ``unfilled``: a miss without a lease because the key is one that reads
    do not fill (see :class:`~stampede.LeaseScope`): nobody rebuilds it, so
    a value this caller computes may be stored with a plain ``set``.
    """

    found: bool
    value: Any = None
    lease: Lease | None = None
    #: With a lease: the stale entry others are served meanwhile, if any.
    stale: Entry | None = None
    unfilled: bool = False


class Lease:
    """The right to rebuild one key, handed out by :meth:`Stampede.read`.

    Belongs to the acquisition, not to a thread: pass it to whoever stores
    the value. Only its holder's ``commit`` stores anything (fenced): a lease
    that lapsed or was cancelled by ``set``/``delete``/``invalidate`` stores
    nothing.
    """

    __slots__ = ("_alone", "_flow", "_keeper", "_on_miss", "_options", "_started", "_won_at", "keys", "token")

    def __init__(
        self,
        keys: Keys,
        token: str,
        flow: Flow,
        options: Options,
        started: float,
        won_at: str | None,
        on_miss: bool = True,
    ) -> None:
        self.keys = keys
        self.token = token
        self._flow = flow
        self._options = options
        self._started = started  # monotonic: the rebuild's duration
        self._won_at = won_at  # the server's clock: tags bumped since make the value stale
        self._keeper: Any = None  # what renews it while a LeaseScope holds it, if anything
        self._on_miss = on_miss  # won on a miss (no stale value in hand): its key read as missing
        #: Not a Redis lease: Redis failed under fail_open, and this holder
        #: rebuilds for the callers of its process, who wait on this flight.
        self._alone: Any = None

    def _stop_renewing(self) -> None:
        """Whoever settles it now: no keeper renews it any more."""
        keeper = self._keeper
        if keeper is not None:
            keeper.drop(self)

    @property
    def key(self) -> str:
        return self.keys.name

    @property
    def without_redis(self) -> bool:
        """Whether Redis failed when it was asked for (under ``fail_open``):
        granted by this process alone, to the first of its callers; the others
        wait for its ``commit``, which Redis may not take."""
        return self._alone is not None

    def __repr__(self) -> str:
        return f"<Lease on {self.key!r}>"


class Paused(NamedTuple):
    """Internal: a flow stopped where it asks for a rebuild (see ``read``)."""

    token: str | None
    stale: Entry | None = None
