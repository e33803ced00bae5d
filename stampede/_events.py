"""Observability: the events stampede reports to a user-supplied callback."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Event", "EventHook", "EventKind", "logger"]

logger = logging.getLogger("stampede")


class EventKind(str, enum.Enum):
    """What happened to a key."""

    HIT = "hit"  #: a fresh value was served
    STALE_HIT = "stale_hit"  #: a stale value was served while another caller refreshes
    MISS = "miss"  #: no usable value in Redis
    LEASE_WON = "lease_won"  #: this caller holds the rebuild lease
    LEASE_BUSY = "lease_busy"  #: another caller holds the rebuild lease
    LEASE_LOST = "lease_lost"  #: the lease expired or was taken while rebuilding
    WAIT = "wait"  #: waiting for another caller's rebuild (``duration`` = time waited)
    WAIT_TIMEOUT = "wait_timeout"  #: gave up waiting after ``wait_timeout``
    REBUILD = "rebuild"  #: a rebuild finished (``duration`` = its run time)
    REBUILD_ERROR = "rebuild_error"  #: a rebuild raised (``error``)
    COMMIT_REJECTED = "commit_rejected"  #: a rebuilt value was not written: lease lost
    COMMIT_FAILED = "commit_failed"  #: a rebuilt value could not be written: Redis failed (``error``)
    CORRUPT = "corrupt"  #: data under the key was not readable; treated as a miss
    REDIS_ERROR = "redis_error"  #: a Redis command failed (``error``)
    FAIL_OPEN = "fail_open"  #: Redis failed, so the rebuild ran without it
    #: the primary failed (a failover, say), so a replica's copy was served
    REPLICA_HIT = "replica_hit"
    #: a blocking call on an event loop's thread found the key being rebuilt
    #: elsewhere: it did not wait (that would freeze the loop), it rebuilt alone
    NO_WAIT = "no_wait"


@dataclass(frozen=True, slots=True)
class Event:
    """One observation about one key.

    Attributes:
        kind: what happened.
        key: the cache key, as the caller gave it (bytes keys decoded for display).
        duration: seconds, for ``REBUILD`` and ``WAIT``; otherwise ``None``.
        error: the exception, for ``REBUILD_ERROR`` and ``REDIS_ERROR``.
        namespace: the namespace of the instance that saw it: what metrics
            are labelled by (never by key, whose values are unbounded).
    """

    kind: EventKind
    key: str
    duration: float | None = None
    error: BaseException | None = None
    namespace: str = ""


EventHook = Callable[[Event], None]
