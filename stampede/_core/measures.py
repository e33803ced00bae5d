"""What the metrics exporters (``stampede.prometheus``, ``stampede.opentelemetry``)
make of events: one table, so that both export the same measures under the
same names."""

from __future__ import annotations

from typing import NamedTuple

from .events import EventKind

__all__ = ["HISTOGRAMS", "MEASURES", "Family", "Measure", "error_type"]


class Family(NamedTuple):
    """A counter (``name`` without ``_total``) or histogram, labelled by
    ``namespace`` and, if given, ``label``."""

    name: str
    description: str
    label: str | None = None


class Measure(NamedTuple):
    """What one event kind counts: ``family`` (with ``label`` set to
    ``value``; ``value`` ``None``: the error's type), and the histogram its
    ``duration`` is observed in, if any."""

    family: Family
    value: str | None = None
    histogram: Family | None = None


_REQUESTS = Family(
    "stampede_requests",
    "Reads of a key by what they found: hit (fresh), near_hit (fresh, from the process's near "
    "cache), stale_hit (stale, served while one caller refreshes), miss (nothing usable), "
    "replica_hit (a replica's copy: the primary failed)",
    "result",
)
_LEASES = Family(
    "stampede_leases",
    "Rebuild leases: won (this caller rebuilds), busy (another caller holds it), "
    "lost (it lapsed or was taken while this caller rebuilt)",
    "outcome",
)
_WAITS = Family("stampede_waits", "Waits for another caller's rebuild")
_REBUILDS = Family("stampede_rebuilds", "Rebuilds run, by outcome: ok, or error (it raised)", "outcome")
_NOT_STORED = Family(
    "stampede_commits_not_stored",
    "Rebuilt values not stored: rejected (the lease had passed on; a newer value stays) "
    "or failed (Redis failed)",
    "reason",
)
_REBUILD_TIME = Family("stampede_rebuild_duration_seconds", "Run time of rebuilds, returned or raised")
_WAIT_TIME = Family("stampede_wait_duration_seconds", "Time spent waiting for another caller's rebuild")

MEASURES: dict[EventKind, Measure] = {
    EventKind.HIT: Measure(_REQUESTS, "hit"),
    EventKind.STALE_HIT: Measure(_REQUESTS, "stale_hit"),
    EventKind.MISS: Measure(_REQUESTS, "miss"),
    EventKind.REPLICA_HIT: Measure(_REQUESTS, "replica_hit"),
    EventKind.LEASE_WON: Measure(_LEASES, "won"),
    EventKind.LEASE_BUSY: Measure(_LEASES, "busy"),
    EventKind.LEASE_LOST: Measure(_LEASES, "lost"),
    EventKind.WAIT: Measure(_WAITS, histogram=_WAIT_TIME),
    EventKind.WAIT_TIMEOUT: Measure(Family("stampede_wait_timeouts", "Waits given up after wait_timeout")),
    EventKind.REBUILD: Measure(_REBUILDS, "ok", _REBUILD_TIME),
    EventKind.REBUILD_ERROR: Measure(_REBUILDS, "error", _REBUILD_TIME),
    EventKind.COMMIT_REJECTED: Measure(_NOT_STORED, "rejected"),
    EventKind.COMMIT_FAILED: Measure(_NOT_STORED, "failed"),
    EventKind.CORRUPT: Measure(Family("stampede_corrupt_entries", "Unreadable entries, treated as misses")),
    EventKind.REDIS_ERROR: Measure(
        Family("stampede_redis_errors", "Redis commands that failed, by exception type", "error_type")
    ),
    EventKind.FAIL_OPEN: Measure(Family("stampede_fail_opens", "Rebuilds run without Redis (fail_open)")),
    EventKind.NEAR_HIT: Measure(_REQUESTS, "near_hit"),
    EventKind.NEAR_INVALIDATION: Measure(
        Family(
            "stampede_near_invalidations",
            "Near copies dropped because their key changed in Redis (written, deleted, expired...)",
        )
    ),
    EventKind.NEAR_EVICTION: Measure(
        Family("stampede_near_evictions", "Near copies dropped to keep the near cache within its bounds")
    ),
    EventKind.NEAR_FLUSH: Measure(
        Family(
            "stampede_near_flushes",
            "Times every near copy was dropped at once: the invalidation connection was lost "
            "or replaced, or Redis was flushed",
        )
    ),
    EventKind.NO_WAIT: Measure(
        Family(
            "stampede_no_waits",
            "Blocking calls on an event loop's thread that rebuilt alone rather than wait",
        )
    ),
    EventKind.UNFILLED: Measure(
        Family(
            "stampede_unfilled_reads",
            "Reads of a missing key that reads do not fill: a miss at once, without a lease",
        )
    ),
    EventKind.REDIS_DOWN: Measure(
        Family(
            "stampede_redis_down",
            "Times Redis was found unreachable and calls began to skip it (the circuit breaker opened)",
        )
    ),
    EventKind.REDIS_UP: Measure(
        Family("stampede_redis_up", "Times Redis answered again after it was found unreachable")
    ),
    EventKind.WRITE_DROPPED: Measure(
        Family(
            "stampede_writes_dropped",
            "Writes and removals Redis failed under fail_open (removals are owed and sent again)",
        )
    ),
}

#: Bucket upper bounds (seconds) of each histogram: rebuilds from a
#: millisecond to max_lease_time's default; waits up to a minute.
HISTOGRAMS: dict[Family, tuple[float, ...]] = {
    _REBUILD_TIME: (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
    _WAIT_TIME: (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
}


def error_type(error: BaseException | None) -> str:
    """An error's type as metrics and spans name it (OpenTelemetry's ``error.type``)."""
    if error is None:
        return "unknown"
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
