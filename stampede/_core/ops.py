"""The operations the core asks its drivers to carry out, and what they send back.

The core's machines (:class:`~stampede._core.flow.Flow` and the calls around
it) are generators: they yield one of these, the driver carries it out (a
script, a wait, the caller's rebuild...) and sends back its result, or throws
the failure in (:class:`~stampede.RedisUnavailableError` for Redis). The
operations name what is wanted, never how: the Redis protocol of each is in
``stampede/_protocol/messages.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from .._exceptions import RedisUnavailableError
from .envelope import Entry
from .keys import Keys

__all__ = [
    "CANCELLED",
    "RELEASED",
    "Acquire",
    "AcquireMany",
    "Acquired",
    "AwaitFlight",
    "Capture",
    "Commit",
    "CommitMany",
    "FirstRead",
    "InBackground",
    "Keep",
    "Lookup",
    "OfKey",
    "Op",
    "ReadMany",
    "ReadTags",
    "Rebuild",
    "RebuildMany",
    "Rebuilt",
    "Refused",
    "Release",
    "ReleaseMany",
    "Reread",
    "RereadMany",
    "Sleep",
    "Standby",
    "Swap",
    "Wait",
    "Waited",
]


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
    :attr:`Acquire.reads`). ``failed``: not won, the last rebuild having
    raised this error (as text) so recently that nobody tries again before
    ``lease_pttl`` ms; ``failures``: how many rebuilds in a row raised (won
    or not).
    """

    won: bool
    current: bytes | None = None
    lease_pttl: int = -2
    won_at: str | None = None
    unfilled: bool = False
    failed: str | None = None
    failures: int = 0


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

    ``if_lapsed``: also write if the lease lapsed, while its record is in
    Redis still: nobody took the key over, and nothing wrote, deleted or
    invalidated it since the lease was won (each of those drops the record).
    """

    token: str
    data: bytes
    if_lapsed: bool = False


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
    #: The rebuild under the lease raised: nobody tries again for a while
    #: (see :func:`~stampede._core.policy.on_rebuild_error`).
    failed: Failure | None = None


class Failure(NamedTuple):
    """A rebuild that raised, as its lease records it for every process: the
    ``failures`` in a row (this one included), the back-off before anyone
    tries again and how long the count is kept after it (ms), and the
    ``error`` as text."""

    failures: int
    backoff_ms: int
    keep_ms: int
    error: str


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
    #: The holder's rebuild raised (its lease records it): try the lease again
    #: to be told the error.
    failed: bool = False


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


@dataclass(frozen=True, slots=True)
class Swap:
    """Replace the key's value ``old`` with ``new`` (SWAP's ``expire``
    argument), if it is still ``old``. Result: whether it was replaced."""

    old: bytes
    new: bytes
    expire: str


# --- within this process ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FirstRead:
    """Read the key as a call's first read does: its near copy if one may be
    served, else ``GET``, and the tag states it needs. Result: the fresh
    :class:`~stampede._core.envelope.Entry` to serve, or a :class:`Lookup`."""


@dataclass(frozen=True, slots=True)
class AwaitFlight:
    """Wait for the leader of this process's flight to finish: until ``done``
    (an event of the driver's flavour) is set, for at most ``timeout``
    seconds (``None``: no bound of its own). Result: whether it was set."""

    done: Any
    timeout: float | None


@dataclass(frozen=True, slots=True)
class InBackground:
    """Carry out ``steps`` (a machine of the same call) in the background,
    named ``name``, while the caller is answered. Result: None; raises
    ``RuntimeError`` when the instance is shutting down."""

    steps: Any
    name: str


@dataclass(frozen=True, slots=True)
class Keep:
    """Renew ``lease`` (a :class:`~stampede.Lease`) while its scope holds it.
    Result: None."""

    lease: Any


# --- many keys at once ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadMany:
    """The raw values of ``names`` (near copies where there are, one ``MGET``
    for the others). Result: a list of bytes or ``None``, in order."""

    names: tuple[Keys, ...]


@dataclass(frozen=True, slots=True)
class RereadMany:
    """Read ``names`` again after a failure: from the primary, else from the
    replicas. Result: ``(from_primary, [(answered, raw), ...])``; raises
    :class:`~stampede.RedisUnavailableError` when neither answers."""

    names: tuple[Keys, ...]


@dataclass(frozen=True, slots=True)
class ReadTags:
    """Read the states of the tags ``ids`` in one round trip. Result: whether
    Redis answered (if not, values carrying them are not judged fresh)."""

    ids: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class AcquireMany:
    """:class:`Acquire` for each ``(keys, token)``, in one round trip.
    Result: an :class:`Acquired` each, in order."""

    asks: tuple[tuple[Keys, str], ...]


@dataclass(frozen=True, slots=True)
class RebuildMany:
    """Call the batch's rebuild function once with ``keys`` (the caller's),
    renewing each of ``leases`` (``(keys, token)``) meanwhile. Result:
    :class:`Rebuilt`, never an exception."""

    keys: tuple[Any, ...]
    leases: tuple[tuple[Keys, str], ...]


@dataclass(frozen=True, slots=True)
class CommitMany:
    """:class:`Commit` for each ``(keys, commit)``, in one round trip. Result:
    ``True`` or a :class:`Refused` each, in order."""

    commits: tuple[tuple[Keys, Commit], ...]


@dataclass(frozen=True, slots=True)
class ReleaseMany:
    """:class:`Release` for each ``(keys, token)``, in one round trip; with
    ``detached``, in the background, tried again until Redis answers (or the
    leases have expired anyway). Result: whether Redis answered."""

    leases: tuple[tuple[Keys, str], ...]
    detached: bool = False
    #: What each lease records of a rebuild that raised (see ``Release.failed``),
    #: in the order of ``leases``; empty: nothing.
    failed: tuple[Failure | None, ...] = ()


@dataclass(frozen=True, slots=True)
class OfKey:
    """``op``, asked by the machine of one key of a batch: carried out on
    ``keys``, a rebuild calling the batch's function for ``key`` alone."""

    keys: Keys
    key: Any
    op: Any


Op = (
    Acquire
    | Capture
    | Rebuild
    | Commit
    | Release
    | Wait
    | Sleep
    | Reread
    | Standby
    | Swap
    | FirstRead
    | AwaitFlight
    | InBackground
    | Keep
    | ReadMany
    | RereadMany
    | ReadTags
    | AcquireMany
    | RebuildMany
    | CommitMany
    | ReleaseMany
    | OfKey
)


class Lookup(NamedTuple):
    """What the first read of a key found.

    ``entry`` is a readable value (due for early refresh, or stale);
    ``error`` a failed read; ``fallback`` a value past its stale window but
    within ``stale_if_error`` (a miss, served only if its rebuild fails or
    Redis does), and ``fallback_raw`` its bytes as read.
    """

    entry: Entry | None
    error: RedisUnavailableError | None = None
    fallback: Entry | None = None
    fallback_raw: bytes | None = None
