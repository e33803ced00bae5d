"""What one measured run is (:class:`Phase`), what the workers saw in it (:class:`PhaseRecord`),
and what the parent adds from Redis afterwards (:class:`PhaseResult`).

Shared by the parent and the worker processes; nothing here touches Redis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .workload import REBUILD_SECONDS

__all__ = ["Phase", "PhaseRecord", "PhaseResult", "Scenario"]

#: ``warmup``: unreported, runs every code path once; ``hit``: one caller times hits against a
#: plain GET; ``cold``: one request per caller on a missing key; ``hot``: callers loop on a key
#: that keeps expiring; ``coherence``: one process writes, another reads (:mod:`bench.herd.coherence`).
Scenario = Literal["warmup", "hit", "cold", "hot", "coherence"]


@dataclass(frozen=True)
class Phase:
    """One measured run: every caller requests ``key`` through the same peer.

    ``duration`` 0 means one request per caller (a cold key); otherwise each
    caller loops for ``duration`` seconds, pausing ``think`` seconds between
    requests. Each rebuild INCRs ``counter_key`` (so rebuilds are counted in
    Redis, across processes), then sleeps ``rebuild_seconds``. With ``warm``,
    one caller fills the key through the peer (a rebuild that is not counted)
    before the phase starts. A ``hit`` phase is run by a single caller:
    ``rounds`` x ``calls`` hits, interleaved with plain GETs.
    """

    scenario: Scenario
    peer: str
    key: str
    ttl: int
    stale_ttl: int = 0
    background: bool = False
    duration: float = 0.0
    think: float = 0.0
    rebuild_seconds: float = REBUILD_SECONDS
    warm: bool = False
    rounds: int = 0
    calls: int = 0

    @property
    def counter_key(self) -> str:
        return f"{self.key}:rebuilds"

    @property
    def row(self) -> str:
        """The row of the tables this phase feeds: the peer, or a variant of it."""
        return f"{self.peer}+background" if self.background else self.peer

    @property
    def budget(self) -> float:
        """A generous bound on the seconds the phase runs (2 ms per hit is very slow)."""
        if self.scenario == "hit":
            return 2 * self.rounds * self.calls * 0.002
        return self.duration + self.rebuild_seconds


@dataclass
class PhaseRecord:
    """What happened in one phase. Times are in seconds; offsets are wall-clock
    seconds after the phase's agreed start time, comparable across processes.

    Attributes:
        latencies: of each request that returned a value.
        ends: offset at which each of those requests returned.
        start_delays: per caller, how late it sent its first request.
        rebuilds: (start, end) offsets of each rebuild that ran.
        errors: one line per request that raised.
        hit_times: of a ``hit`` phase: per variant, the seconds per call of each round.
        hit_calls: of a ``hit`` phase: per variant, how many calls it made in all.
    """

    latencies: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    start_delays: list[float] = field(default_factory=list)
    rebuilds: list[tuple[float, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    hit_times: dict[str, list[float]] = field(default_factory=dict)
    hit_calls: dict[str, int] = field(default_factory=dict)

    def absorb(self, other: PhaseRecord) -> None:
        self.latencies.extend(other.latencies)
        self.ends.extend(other.ends)
        self.start_delays.extend(other.start_delays)
        self.rebuilds.extend(other.rebuilds)
        self.errors.extend(other.errors)
        # Only one caller of one process times a hit phase: nothing to merge.
        self.hit_times.update(other.hit_times)
        self.hit_calls.update(other.hit_calls)

    @property
    def requests(self) -> int:
        return len(self.latencies) + len(self.errors)


@dataclass(frozen=True)
class PhaseResult:
    """A phase with what the workers recorded and what its Redis says about it.

    ``rebuilds`` is the phase's counter in Redis; ``commands`` the commands its
    Redis processed between the phase's start and the end of its last caller,
    less the parent's own ``INFO`` calls (``None``: not measured).
    """

    phase: Phase
    record: PhaseRecord
    rebuilds: int
    commands: int | None

    @property
    def commands_per_request(self) -> float:
        """Commands per request, the rebuilds' own INCR not counted (it is the simulated work)."""
        if self.commands is None or not self.record.requests:
            return float("nan")
        return (self.commands - self.rebuilds) / self.record.requests
