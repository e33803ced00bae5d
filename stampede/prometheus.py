"""Prometheus metrics from stampede's events (``pip install redis-stampede[prometheus]``).

>>> sf = stampede.Stampede(client, on_event=stampede.prometheus.Metrics())

or, in a settings file, the dotted path ``stampede.prometheus.on_event`` (a
:class:`Metrics` on prometheus-client's default registry, made at the first
event). Every family is labelled by ``namespace`` (the instance's: see
``Stampede(namespace=...)``), never by key, whose values are unbounded:

======================================================  ==========================================
Family                                                  What it counts
======================================================  ==========================================
``stampede_requests_total{result}``                     reads of a key by what they found: ``hit``,
                                                        ``near_hit`` (from the near cache),
                                                        ``stale_hit``, ``miss``, ``replica_hit``
``stampede_leases_total{outcome}``                      ``won``, ``busy`` (another caller holds
                                                        it), ``lost`` (lapsed while rebuilding)
``stampede_waits_total``                                waits for another caller's rebuild
``stampede_wait_timeouts_total``                        waits given up after ``wait_timeout``
``stampede_rebuilds_total{outcome}``                    ``ok``, ``error`` (the rebuild raised)
``stampede_commits_not_stored_total{reason}``           ``rejected`` (the lease had passed on),
                                                        ``failed`` (Redis failed)
``stampede_corrupt_entries_total``                      unreadable entries, treated as misses
``stampede_redis_errors_total{error_type}``             failed Redis commands, by exception type
``stampede_fail_opens_total``                           rebuilds run without Redis (``fail_open``)
``stampede_no_waits_total``                             calls on an event loop's thread that
                                                        rebuilt alone rather than wait
``stampede_unfilled_reads_total``                       reads of a missing key that reads do not
                                                        fill: a miss at once, without a lease
``stampede_near_invalidations_total``                   near copies dropped because their key
                                                        changed in Redis
``stampede_near_evictions_total``                       near copies dropped to stay within bounds
``stampede_near_flushes_total``                         times every near copy was dropped at once
``stampede_redis_down_total``                           times Redis was found unreachable and calls
                                                        began to skip it (circuit breaker opened)
``stampede_redis_up_total``                             times it answered again after that
``stampede_writes_dropped_total``                       writes and removals Redis failed under
                                                        ``fail_open`` (removals are sent again)
``stampede_rebuild_duration_seconds`` (histogram)       rebuild run time, 1 ms to 300 s buckets
``stampede_wait_duration_seconds`` (histogram)          time waited, 1 ms to 60 s buckets
======================================================  ==========================================

A stale read that wins the lease counts as ``leases_total{outcome="won"}``,
not as a request: it is served the rebuild. ``_count`` of each histogram
equals its counter (``rebuilds_total`` summed over outcomes, ``waits_total``).

Each registry holds one set of these collectors: every :class:`Metrics` on
the same registry shares them (so a Flask app factory may make one per app);
a registry that already holds a ``stampede_*`` collector of someone else's
is refused with a :class:`ValueError`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
except ImportError as exc:
    raise ImportError(
        "stampede.prometheus needs prometheus-client: pip install redis-stampede[prometheus]"
    ) from exc

from ._core.events import Event, EventKind
from ._core.measures import HISTOGRAMS, MEASURES, Family, Measure, error_type

__all__ = ["Metrics", "on_event"]

_Record = Callable[[Event], None]


class _Collectors:
    """The collectors of one registry, and what each (kind, namespace) records."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.families: dict[Family, Any] = {}
        for measure in MEASURES.values():
            family = measure.family
            if family not in self.families:
                labels = ["namespace"] + ([family.label] if family.label else [])
                self.families[family] = Counter(family.name, family.description, labels, registry=None)
            if measure.histogram is not None and measure.histogram not in self.families:
                histogram = measure.histogram
                self.families[histogram] = Histogram(
                    histogram.name,
                    histogram.description,
                    ["namespace"],
                    buckets=HISTOGRAMS[histogram],
                    registry=None,
                )
        registered: list[Any] = []
        try:
            for collector in self.families.values():
                registry.register(collector)
                registered.append(collector)
        except ValueError as exc:
            for collector in registered:
                registry.unregister(collector)
            raise ValueError(
                f"stampede.prometheus: this registry already has a collector of stampede's names ({exc}), "
                "not made by stampede.prometheus.Metrics"
            ) from exc
        self.plans: dict[tuple[EventKind, str], _Record] = {}

    def plan(self, kind: EventKind, namespace: str) -> _Record:
        """What to record for ``kind`` in ``namespace``, with the label
        children looked up once, not on every event."""
        measure: Measure | None = MEASURES.get(kind)
        if measure is None:  # a kind newer than this table: not counted
            record: _Record = _ignore
        else:
            family = self.families[measure.family]
            if measure.family.label is not None and measure.value is None:
                record = _by_error_type(family, namespace)
            else:
                values = (namespace, measure.value) if measure.value else (namespace,)
                inc = family.labels(*values).inc
                if measure.histogram is None:
                    record = _counted(inc)
                else:
                    record = _timed(inc, self.families[measure.histogram].labels(namespace).observe)
        self.plans[kind, namespace] = record
        return record


def _ignore(event: Event) -> None:
    pass


def _counted(inc: Callable[[], None]) -> _Record:
    def record(event: Event) -> None:
        inc()

    return record


def _timed(inc: Callable[[], None], observe: Callable[[float], None]) -> _Record:
    def record(event: Event) -> None:
        inc()
        if event.duration is not None:
            observe(event.duration)

    return record


def _by_error_type(family: Any, namespace: str) -> _Record:
    def record(event: Event) -> None:
        family.labels(namespace, error_type(event.error)).inc()

    return record


_shared: weakref.WeakKeyDictionary[CollectorRegistry, _Collectors] = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


class Metrics:
    """An ``on_event`` hook that counts stampede's events into ``registry``
    (``None``: prometheus-client's default ``REGISTRY``). Cheap: a dict
    lookup and a counter increment per event."""

    __slots__ = ("_collectors", "_plans", "registry")

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = REGISTRY if registry is None else registry
        with _shared_lock:
            collectors = _shared.get(self.registry)
            if collectors is None:
                collectors = _shared[self.registry] = _Collectors(self.registry)
        self._collectors = collectors
        self._plans = collectors.plans

    def __call__(self, event: Event) -> None:
        try:
            record = self._plans[event.kind, event.namespace]
        except KeyError:
            record = self._collectors.plan(event.kind, event.namespace)
        record(event)

    def __repr__(self) -> str:
        return f"stampede.prometheus.Metrics(registry={self.registry!r})"


_default: Metrics | None = None


def on_event(event: Event) -> None:
    """An ``on_event`` hook counting into a :class:`Metrics` on the default
    registry, made at the first event: ``"ON_EVENT":
    "stampede.prometheus.on_event"`` in a Django ``CACHES`` entry,
    ``STAMPEDE_ON_EVENT`` in Flask."""
    global _default
    metrics = _default
    if metrics is None:
        metrics = _default = Metrics()  # racing threads get the same collectors
    metrics(event)
