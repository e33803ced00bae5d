"""What a caller is given when something fails: each rule written once, here.

The machines (:mod:`~stampede._core.flow` for one key across processes,
:mod:`~stampede._core.calls` for the callers of one process and for reads
without a lease, :mod:`~stampede._core.batch` for many keys) ask these
functions what to do, for one key or for a batch alike, and carry out the
answer:

- :func:`on_redis_failure`: Redis failed before a value could be rebuilt
  under a lease (stale-if-error, then fail-open);
- :func:`keeps_alone`: whether a value rebuilt without Redis is kept in
  the process for the next callers;
- :func:`on_rebuild_error`: the rebuild raised (stale-if-error);
- :func:`failure`, :func:`on_backoff`: after a rebuild raised, nobody tries
  again for a growing back-off, recorded in Redis for every process;
- :func:`on_store_failure`: the rebuilt value could not be stored;
- :func:`committed`: a commit that Redis failed is tried again within the lease;
- :func:`on_refused_commit`: a newer write refused the commit;
- :class:`Failover`: a primary that may be failing over is tried again, with
  backoff, within ``wait_timeout``;
- :func:`on_wait_timeout`: a caller waited ``wait_timeout`` in vain;
- :func:`on_plain_failure`: Redis failed a call without a rebuild (``get``,
  ``set``, ``delete``...): what it answers under ``fail_open``, and what
  removal Redis is owed.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Generator
from typing import Any, NamedTuple

from .._exceptions import RebuildFailedError, RedisUnavailableError, WaitTimeoutError
from .clock import Clock
from .envelope import Entry
from .events import EventKind, logger
from .ops import Acquired, Commit, Failure, Op, Refused, Sleep
from .options import Options

__all__ = [
    "COMMIT_BACKOFF",
    "COMMIT_FIRST_PAUSE",
    "FAILOVER_BACKOFF",
    "FAILOVER_FIRST_PAUSE",
    "OWED_RETRY",
    "REBUILD_FIRST_PAUSE",
    "REBUILD_LONGEST_PAUSE",
    "REFUSAL_WARNING_INTERVAL",
    "REFUSED_WRITES",
    "Failover",
    "Fallback",
    "committed",
    "failure",
    "keeps_alone",
    "on_backoff",
    "on_plain_failure",
    "on_rebuild_error",
    "on_redis_failure",
    "on_refused_commit",
    "on_store_failure",
    "on_wait_timeout",
    "skips_retries",
]

#: The first pause before trying a commit that failed again, and the longest.
COMMIT_FIRST_PAUSE = 0.05
COMMIT_BACKOFF = 0.5
#: Refusals of a write by a Redis that is up and answers reads: out of memory
#: (``OOM``), writes stopped after a failed save (``MISCONF``), a value over
#: its ``proto-max-bulk-len`` (``TOO_LARGE``). No outage: asking again does
#: not mend them, and a read must not fail for them.
REFUSED_WRITES = ("OOM", "MISCONF", "TOO_LARGE")
#: The back-off after a rebuild raised: the first, the longest, and how far
#: each is moved at random (a fraction of it).
REBUILD_FIRST_PAUSE = 0.5
REBUILD_LONGEST_PAUSE = 2.0
REBUILD_JITTER = 0.25
#: The most characters of a failed rebuild's error that its lease records.
MOST_ERROR_TEXT = 300
#: The shortest pause between two tries of sending the removals owed to Redis.
OWED_RETRY = 0.25
#: The first pause before trying a primary that failed again.
FAILOVER_FIRST_PAUSE = 0.05
#: The longest pause between two tries of a primary that is failing over.
FAILOVER_BACKOFF = 0.5


class Fallback(enum.Enum):
    """What a caller is given instead of a value rebuilt under a lease."""

    #: The stale value in hand.
    STALE = "stale"
    #: A value rebuilt for this caller alone, stored nowhere.
    ALONE = "alone"


def _named(name: str | None) -> str:
    """How the logs name what failed: a key, or a batch (``None``)."""
    return "a batch" if name is None else repr(name)


#: Seconds between two warnings of a refusal of writes (``OOM``...) by a Redis
#: that answers: one per call would flood the logs of a busy site while
#: Redis is full; the others of the interval are debug lines, and counted.
REFUSAL_WARNING_INTERVAL = 10.0
#: By refusal code: when it was last warned of (monotonic), and how many
#: since went to debug.
_refusals: dict[str, list[float]] = {}


def _log(error: RedisUnavailableError, message: str, *args: object) -> None:
    """A warning per call while Redis fails; a debug line once its breaker
    is open (the breaker's opening was logged once, as a warning). A write
    Redis refuses (it answers: no breaker opens) is warned of once per
    :data:`REFUSAL_WARNING_INTERVAL`, with how many went unwarned since."""
    if error.skipped:
        logger.debug(message, *args)
        return
    if error.code not in REFUSED_WRITES:
        logger.warning(message, *args)
        return
    now = time.monotonic()
    last = _refusals.setdefault(error.code, [-REFUSAL_WARNING_INTERVAL, 0.0])
    if now - last[0] < REFUSAL_WARNING_INTERVAL:
        last[1] += 1
        logger.debug(message, *args)
        return
    quiet, last[0], last[1] = int(last[1]), now, 0.0
    more = (
        f" ({quiet} more like it in the last {REFUSAL_WARNING_INTERVAL:g} s, logged at debug)"
        if quiet
        else ""
    )
    logger.warning(message + more, *args)


def on_redis_failure(
    name: str | None,
    error: RedisUnavailableError,
    *,
    stale: bool,
    options: Options,
    emit: Callable[..., None],
) -> Fallback:
    """Redis failed before a value could be rebuilt and stored under a lease
    (the read, the lease request, a wait). ``stale``: every caller concerned
    has a value in hand. Raises ``error`` when no rule applies.

    Stale-if-error first: a value in hand beats a rebuild against a sick
    Redis. Then fail-open, if the user chose it: rebuild without Redis. A
    Redis that refuses writes (:data:`REFUSED_WRITES`: out of memory, the
    lease among them) is no outage: the value is rebuilt without the lease
    and returned, ``fail_open`` or not, as a read must not fail for a write.
    """
    if stale:
        _log(error, "Redis failed refreshing %s; serving its stale value: %s", _named(name), error)
        return Fallback.STALE
    if not options.fail_open and error.code not in REFUSED_WRITES:
        raise error
    _log(error, "Redis failed for %s; rebuilding without it: %s", _named(name), error)
    emit(EventKind.FAIL_OPEN, error=error)
    return Fallback.ALONE


def keeps_alone(error: RedisUnavailableError) -> bool:
    """Whether a value rebuilt without Redis, after ``error``, is kept in the
    process for the key's next callers within its ``ttl`` (single flight
    while Redis is away). Not where Redis is up and refuses only to grow
    (``OOM``: full under ``noeviction``): other callers' deletes and writes
    reach it still, and a copy kept here would outlive them. Every caller
    then rebuilds (the callers of one process at the same time share one
    rebuild): a full Redis costs rebuilds, never a removed value served."""
    return error.code != "OOM"


def on_rebuild_error(name: str | None, error: BaseException, *, stale: bool) -> bool:
    """The rebuild under the lease raised ``error`` (the lease is freed):
    whether the caller is served the stale value (``stale``: one is in hand)
    rather than the error. A cancellation or interrupt always reaches it."""
    if not isinstance(error, Exception) or not stale:
        return False
    logger.warning("rebuild of %s raised; serving its stale value", _named(name), exc_info=error)
    return True


def failure(error: BaseException, failures: int, random: Callable[[], float]) -> Failure | None:
    """What the lease records of a rebuild that raised ``error`` after
    ``failures`` in a row had (``None``: nothing, for a cancellation or
    interrupt, which says nothing of the data source): nobody tries again
    for a back-off that starts at :data:`REBUILD_FIRST_PAUSE` and doubles with
    each failure in a row, up to :data:`REBUILD_LONGEST_PAUSE`, moved at
    random by a quarter so that a fleet does not retry in step. Meanwhile
    callers with a stale value are served it, and callers with nothing get
    the error at once (:func:`on_backoff`); the count is kept for one more
    longest pause, so that a source that fails again backs off longer."""
    if not isinstance(error, Exception):
        return None
    failures += 1
    pause = min(REBUILD_FIRST_PAUSE * 2 ** min(failures - 1, 16), REBUILD_LONGEST_PAUSE)
    pause *= 1 + REBUILD_JITTER * (2 * random() - 1)
    text = f"{type(error).__name__}: {error}"
    if len(text) > MOST_ERROR_TEXT:
        text = text[: MOST_ERROR_TEXT - 3] + "..."
    return Failure(failures, max(1, round(pause * 1000)), round(REBUILD_LONGEST_PAUSE * 1000), text)


def on_backoff(name: str, acquired: Acquired) -> RebuildFailedError:
    """The lease records that the last rebuild of ``name`` raised, too
    recently to try again: the error a caller with nothing in hand gets at
    once (one with a stale value is served it)."""
    assert acquired.failed is not None
    return RebuildFailedError(
        name, acquired.failed, failures=acquired.failures, retry_in=max(0, acquired.lease_pttl) / 1000
    )


def on_store_failure(
    name: str | None, error: RedisUnavailableError, *, stale: bool, options: Options
) -> Fallback:
    """A value was rebuilt but Redis failed to store it (the lease is freed,
    its waiters told to compete for it again). Raises ``error`` when neither
    rule applies.

    Handing the caller a value Redis does not have would let it be served an
    older one next: serve what Redis has (the stale value), or fail, unless
    the user chose ``fail_open`` (availability over that guarantee).
    """
    if stale:
        _log(error, "could not store the rebuilt %s (%s); serving its stale value", _named(name), error)
        return Fallback.STALE
    if not options.fail_open and error.code not in REFUSED_WRITES:
        raise error
    _log(error, "could not store the rebuilt %s (%s); serving it", _named(name), error)
    return Fallback.ALONE


def skips_retries(error: RedisUnavailableError, options: Options) -> bool:
    """Whether a call that ``error`` failed is to give up at once rather than
    try again: under ``fail_open`` (its callers are not held up by Redis), or
    when Redis refused for memory or size (asking again does not mend either)."""
    return options.fail_open or error.code in REFUSED_WRITES


def committed(commit: Commit, options: Options, clock: Clock) -> Generator[Op, Any, bool | Refused]:
    """Carry out ``commit``, tried again while Redis fails it, for as long as
    the lease would still be ours (``lease_ttl``); raise the last failure after,
    or at once where retries are skipped (:func:`skips_retries`).
    A commit is safe to repeat: the script recognises its own earlier write."""
    give_up_at = clock.monotonic() + options.lease_ttl
    delay = COMMIT_FIRST_PAUSE
    while True:
        try:
            outcome: bool | Refused = yield commit
        except RedisUnavailableError as error:
            if skips_retries(error, options) or clock.monotonic() + delay >= give_up_at:
                raise
            yield Sleep(delay)
            delay = min(delay * 2, COMMIT_BACKOFF)
            continue
        return outcome


def on_refused_commit(name: str, rebuilt: Any, newer: Entry | None, emit: Callable[..., None]) -> Any:
    """A newer write refused the commit of ``rebuilt``: what the caller is
    served. What that write left, even stale (after an invalidate): handed
    the value it rebuilt, the caller would next be served that older one."""
    logger.info("rebuilt %r but its lease had passed on; the newer value stays", name)
    emit(EventKind.COMMIT_REJECTED)
    return newer.value if newer is not None else rebuilt


def on_wait_timeout(name: str, options: Options, emit: Callable[..., None]) -> None:
    """A caller waited ``wait_timeout`` in vain for another's rebuild: raises
    :class:`~stampede.WaitTimeoutError` under ``on_wait_timeout="raise"``;
    returns when the caller is to go on alone (rebuild for itself, or miss)."""
    emit(EventKind.WAIT_TIMEOUT)
    if options.on_wait_timeout == "raise":
        raise WaitTimeoutError(name, options.wait_timeout)
    logger.warning("waited %gs for the rebuild of %r; going on without it", options.wait_timeout, name)


class Failover(NamedTuple):
    """How a caller outlasts a primary that failed: tried again, with backoff,
    where it can be replaced (a Redis Cluster, a Sentinel-managed master: a
    replica is promoted), until ``deadline`` (monotonic); never under
    ``fail_open``, whose callers are not held up by Redis."""

    fails_over: bool
    options: Options
    clock: Clock
    deadline: float

    def pause(self, error: RedisUnavailableError, pause: float) -> Generator[Op, Any, float]:
        """After ``error``: raise it where the primary cannot fail over (or
        time is up); else sleep ``pause`` before the next try and return the
        pause after that one."""
        if (
            not self.fails_over
            or self.options.fail_open
            or error.code in REFUSED_WRITES
            or self.clock.monotonic() + pause >= self.deadline
        ):
            raise error
        yield Sleep(pause)
        return min(pause * 2, FAILOVER_BACKOFF)

    def until_primary(self, op: Op, error: RedisUnavailableError) -> Generator[Op, Any, Any]:
        """Carry out ``op`` until the primary answers; raise the last error after."""
        pause = FAILOVER_FIRST_PAUSE
        while True:
            pause = yield from self.pause(error, pause)
            try:
                return (yield op)
            except RedisUnavailableError as exc:
                error = exc


#: What each plain call answers under ``fail_open`` when Redis fails it: what
#: it would answer on an empty cache that stores nothing (as Django's
#: ``DummyCache``): reads miss, ``add`` says it stored, ``touch`` found
#: nothing, removals removed nothing.
FAILED_OPEN_ANSWERS: dict[str, Any] = {
    "get": None,
    "get_many": {},
    "has_key": False,
    "set": None,
    "set_many": None,
    "add": True,
    "touch": False,
    "incr": None,
    "delete": False,
    "delete_many": 0,
    "invalidate": False,
    "invalidate_tags": None,
    "delete_tags": None,
    "invalidate_all": None,
    "delete_prefix": 0,
    "clear": 0,
    "release": None,
}

#: The calls whose effect Redis is owed when it fails them (the rest leave
#: nothing that could be served wrong: a read, an ``add`` or ``touch`` not
#: done, an ``incr`` reported as missing).
OWING_CALLS = frozenset(
    {
        "set",
        "set_many",
        "delete",
        "delete_many",
        "invalidate",
        "invalidate_tags",
        "delete_tags",
        "invalidate_all",
        "delete_prefix",
        "clear",
    }
)


def on_plain_failure(
    call: str, error: RedisUnavailableError, options: Options, emit: Callable[..., None]
) -> Any:
    """Redis failed ``call`` (a method without a rebuild: ``get``, ``set``,
    ``delete``...): raises ``error`` unless ``fail_open``; else returns what
    the call answers (:data:`FAILED_OPEN_ANSWERS`). A call in
    :data:`OWING_CALLS` is to be owed to Redis (see
    :mod:`~stampede._core.owed`), so that an outage loses no removal."""
    if not options.fail_open:
        raise error
    _log(error, "Redis failed %s; going on without it (fail_open): %s", call, error)
    emit(EventKind.WRITE_DROPPED if call in OWING_CALLS else EventKind.FAIL_OPEN, error=error)
    answer = FAILED_OPEN_ANSWERS[call]
    return dict(answer) if isinstance(answer, dict) else answer
