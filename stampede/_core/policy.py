"""What a caller is given when something fails: each rule written once, here.

The machines (:mod:`~stampede._core.flow` for one key across processes,
:mod:`~stampede._core.calls` for the callers of one process and for reads
without a lease, :mod:`~stampede._core.batch` for many keys) ask these
functions what to do, for one key or for a batch alike, and carry out the
answer:

- :func:`on_redis_failure`: Redis failed before a value could be rebuilt
  under a lease (stale-if-error, then fail-open);
- :func:`on_rebuild_error`: the rebuild raised (stale-if-error);
- :func:`on_store_failure`: the rebuilt value could not be stored;
- :func:`committed`: a commit that Redis failed is tried again within the lease;
- :func:`on_refused_commit`: a newer write refused the commit;
- :class:`Failover`: a primary that may be failing over is tried again, with
  backoff, within ``wait_timeout``;
- :func:`on_wait_timeout`: a caller waited ``wait_timeout`` in vain.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Generator
from typing import Any, NamedTuple

from .._exceptions import RedisUnavailableError, WaitTimeoutError
from .clock import Clock
from .envelope import Entry
from .events import EventKind, logger
from .ops import Commit, Op, Refused, Sleep
from .options import Options

__all__ = [
    "COMMIT_BACKOFF",
    "COMMIT_FIRST_PAUSE",
    "FAILOVER_BACKOFF",
    "FAILOVER_FIRST_PAUSE",
    "Failover",
    "Fallback",
    "committed",
    "on_rebuild_error",
    "on_redis_failure",
    "on_refused_commit",
    "on_store_failure",
    "on_wait_timeout",
]

#: The first pause before trying a commit that failed again, and the longest.
COMMIT_FIRST_PAUSE = 0.05
COMMIT_BACKOFF = 0.5
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
    has a value in hand. Raises ``error`` when neither rule applies.

    Stale-if-error first: a value in hand beats a rebuild against a sick
    Redis. Then fail-open, if the user chose it: rebuild without Redis.
    """
    if stale:
        logger.warning("Redis failed refreshing %s; serving its stale value: %s", _named(name), error)
        return Fallback.STALE
    if not options.fail_open:
        raise error
    logger.warning("Redis failed for %s; rebuilding without it (fail_open): %s", _named(name), error)
    emit(EventKind.FAIL_OPEN, error=error)
    return Fallback.ALONE


def on_rebuild_error(name: str | None, error: BaseException, *, stale: bool) -> bool:
    """The rebuild under the lease raised ``error`` (the lease is freed):
    whether the caller is served the stale value (``stale``: one is in hand)
    rather than the error. A cancellation or interrupt always reaches it."""
    if not isinstance(error, Exception) or not stale:
        return False
    logger.warning("rebuild of %s raised; serving its stale value", _named(name), exc_info=error)
    return True


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
        logger.warning("could not store the rebuilt %s (%s); serving its stale value", _named(name), error)
        return Fallback.STALE
    if not options.fail_open:
        raise error
    logger.warning("could not store the rebuilt %s (%s); serving it (fail_open)", _named(name), error)
    return Fallback.ALONE


def committed(commit: Commit, options: Options, clock: Clock) -> Generator[Op, Any, bool | Refused]:
    """Carry out ``commit``, tried again while Redis fails it, for as long as
    the lease would still be ours (``lease_ttl``); raise the last failure after.
    A commit is safe to repeat: the script recognises its own earlier write."""
    give_up_at = clock.monotonic() + options.lease_ttl
    delay = COMMIT_FIRST_PAUSE
    while True:
        try:
            outcome: bool | Refused = yield commit
        except RedisUnavailableError:
            if clock.monotonic() + delay >= give_up_at:
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
        if not self.fails_over or self.options.fail_open or self.clock.monotonic() + pause >= self.deadline:
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
