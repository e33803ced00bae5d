"""Scenario 2: a cold key, 64 callers at once, a rebuild that takes 200 ms.

Naive cache-aside (GET; on a miss rebuild, then SET with EX) against
stampede's ``get_or_rebuild(key, rebuild, ttl=60)``, on fresh keys, the two
approaches alternating trial by trial.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis

from ._load import run_phases
from ._stats import median
from ._workers import Mode, Phase, PhaseRecord
from ._workload import REBUILD_SECONDS, key_prefix
from .report import Section, Table, millis

__all__ = ["run"]

TTL = 60
#: The target: the slowest caller of a cold key is served within this much of the rebuild itself.
SLACK_TARGET = 0.010

_APPROACHES: dict[Mode, str] = {
    "naive": "naive cache-aside (GET, miss: rebuild + SET EX)",
    "stampede": "stampede `get_or_rebuild(key, rebuild, ttl=60)`",
}


@dataclass(frozen=True)
class _Trial:
    rebuilds: int
    record: PhaseRecord

    @property
    def p50(self) -> float:
        return median(self.record.latencies)

    @property
    def slowest(self) -> float:
        return max(self.record.latencies, default=float("nan"))

    @property
    def rebuild_started(self) -> float:
        """Seconds after the agreed start at which the first rebuild began."""
        return min((start for start, _ in self.record.rebuilds), default=float("nan"))

    @property
    def served_after_rebuild(self) -> float:
        """Seconds between the end of the last rebuild and the last caller getting its value."""
        last_rebuild = max((end for _, end in self.record.rebuilds), default=float("nan"))
        return max(self.record.ends, default=float("nan")) - last_rebuild


def run(url: str, *, run_id: str, trials: int, processes: int, threads: int) -> Section:
    prefix = f"{key_prefix(run_id)}cold:"
    # One short, unreported trial per approach first: loads the Lua scripts into
    # the server and runs every code path once in every worker.
    warmups = [Phase(mode, f"{prefix}warmup:{mode}", ttl=TTL, rebuild_seconds=0.05) for mode in _APPROACHES]
    measured = [
        Phase(mode, f"{prefix}{mode}:{trial}", ttl=TTL) for trial in range(trials) for mode in _APPROACHES
    ]
    records = run_phases(url, [*warmups, *measured], processes=processes, threads=threads)[len(warmups) :]

    client = redis.Redis.from_url(url, socket_timeout=10.0)
    try:
        results: dict[Mode, list[_Trial]] = {mode: [] for mode in _APPROACHES}
        for phase, record in zip(measured, records, strict=True):
            results[phase.mode].append(_Trial(int(client.get(phase.counter_key) or 0), record))
    finally:
        client.close()

    callers = processes * threads
    rows = [_row(_APPROACHES[mode], trials_of_mode) for mode, trials_of_mode in results.items()]
    start_spread = max(max(t.record.start_delays) for ts in results.values() for t in ts)
    return Section(
        title=f"2. Cold key, {callers} concurrent callers ({processes} processes x {threads} threads)",
        intro=(
            f"A key nobody has built yet; all {callers} callers ask for it at the same instant; the "
            f"rebuild INCRs a Redis counter and sleeps {millis(REBUILD_SECONDS)}. {trials} trial(s) per "
            "approach on fresh keys, alternating approaches; latency is per caller, from its call "
            "to its return."
        ),
        table=Table(
            headers=[
                "approach",
                "rebuilds per trial",
                "caller p50 (median trial)",
                "slowest caller (median / worst trial)",
                f"slowest minus the {millis(REBUILD_SECONDS)} rebuild (worst)",
                "errors",
            ],
            rows=rows,
            align="lrrrrr",
        ),
        notes=[
            *_verdict(results["stampede"], callers),
            _timeline(results["stampede"]),
            f"Every caller sent its request within {millis(start_spread)} of the agreed start time.",
        ],
    )


def _row(label: str, trials: Sequence[_Trial]) -> list[str]:
    slowest = [t.slowest for t in trials]
    return [
        label,
        ", ".join(str(t.rebuilds) for t in trials),
        millis(median([t.p50 for t in trials])),
        f"{millis(median(slowest))} / {millis(max(slowest))}",
        millis(max(slowest) - REBUILD_SECONDS),
        str(sum(len(t.record.errors) for t in trials)),
    ]


def _timeline(trials: Sequence[_Trial]) -> str:
    started = [t.rebuild_started for t in trials]
    served = [t.served_after_rebuild for t in trials]
    return (
        "Where stampede's extra time goes (median / worst trial): its rebuild began "
        f"{millis(median(started))} / {millis(max(started))} after the agreed start (a GET, the miss "
        f"and the lease, with all {len(trials[0].record.start_delays)} callers starting at once), and "
        f"the last caller had its value {millis(median(served))} / {millis(max(served))} after the "
        "rebuild ended."
    )


def _verdict(trials: Sequence[_Trial], callers: int) -> list[str]:
    worst_rebuilds = max(t.rebuilds for t in trials)
    worst_slack = max(t.slowest for t in trials) - REBUILD_SECONDS
    answered = min(len(t.record.latencies) for t in trials)
    met = worst_rebuilds == 1 and worst_slack <= SLACK_TARGET and answered == callers
    notes = [
        f"Target for stampede: 1 rebuild, slowest caller within {millis(SLACK_TARGET)} of the rebuild: "
        f"{'met' if met else 'NOT met'} (worst trial: {worst_rebuilds} rebuild(s), "
        f"slowest caller {millis(worst_slack)} after the rebuild)."
    ]
    if answered != callers:
        notes.append(f"Only {answered} of {callers} stampede callers got a value in the worst trial.")
    for t in trials:
        notes.extend(f"stampede error: {error}" for error in sorted(set(t.record.errors)))
    return notes
