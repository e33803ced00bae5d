"""Scenario 3: a hot key that expires every second, under 64 callers looping requests.

Naive cache-aside with EX 1, stampede refreshing inline (``ttl=1,
stale_ttl=30``), and stampede refreshing in the background (the same, with
``background=True``). Rebuilds are grouped into expiries by their start
times: rebuilds less than half a TTL apart belong to the same expiry.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass

import redis

import stampede

from ._load import run_phases
from ._stats import median, percentile
from ._workers import Mode, Phase, PhaseRecord
from ._workload import NAMESPACE, REBUILD_SECONDS, key_prefix, make_value
from .report import Section, Table, millis

__all__ = ["run"]

TTL = 1
STALE_TTL = 30
#: A request slower than this waited for a rebuild (the rebuild takes 200 ms).
SLOW = 0.1

_APPROACHES: dict[Mode, str] = {
    "naive": "naive cache-aside, `EX 1`",
    "stampede": "stampede inline refresh, `ttl=1, stale_ttl=30`",
    "stampede-bg": "stampede `background=True`, `ttl=1, stale_ttl=30`",
}


@dataclass(frozen=True)
class _Result:
    phase: Phase
    record: PhaseRecord
    rebuilds: int  # as counted in Redis

    @property
    def expiries(self) -> list[int]:
        """How many rebuilds each expiry caused, in order."""
        return _bursts(sorted(start for start, _ in self.record.rebuilds), gap=self.phase.ttl / 2)

    @property
    def per_expiry(self) -> float:
        return self.rebuilds / len(self.expiries) if self.expiries else float("nan")

    @property
    def slow(self) -> int:
        return sum(latency > SLOW for latency in self.record.latencies)


def run(url: str, *, run_id: str, duration: float, think: float, processes: int, threads: int) -> Section:
    prefix = f"{key_prefix(run_id)}hot:"
    phases = [
        Phase(
            mode,
            f"{prefix}{mode}",
            ttl=TTL,
            stale_ttl=0 if mode == "naive" else STALE_TTL,
            duration=duration,
            think=think,
        )
        for mode in _APPROACHES
    ]
    client = redis.Redis.from_url(url, socket_timeout=10.0)
    sf = stampede.Stampede(client, namespace=NAMESPACE)

    def fill(phase: Phase) -> None:
        # Start from a warm key, as a hot key would be: only expiries are measured.
        if phase.mode == "naive":
            client.set(phase.key, pickle.dumps(make_value(), pickle.HIGHEST_PROTOCOL), ex=phase.ttl)
        else:
            sf.set(phase.key, make_value(), ttl=phase.ttl, stale_ttl=phase.stale_ttl)

    try:
        records = run_phases(url, phases, processes=processes, threads=threads, prepare=fill)
        results = [
            _Result(phase, record, int(client.get(phase.counter_key) or 0))
            for phase, record in zip(phases, records, strict=True)
        ]
    finally:
        sf.close()
        client.close()

    callers = processes * threads
    return Section(
        title=(
            f"3. Hot key expiring every second, {callers} callers "
            f"({processes} processes x {threads} threads)"
        ),
        intro=(
            f"The key starts warm and goes stale {TTL} s after each write; every caller loops requests "
            f"for {duration:g} s with a {millis(think)} pause between them; the rebuild sleeps "
            f"{millis(REBUILD_SECONDS)}. An expiry is a burst of rebuilds (rebuilds starting less than "
            f"{TTL / 2:g} s apart); a request over {millis(SLOW)} waited for a rebuild."
        ),
        table=Table(
            headers=[
                "approach",
                "rebuilds / expiries",
                "rebuilds per expiry (mean / worst)",
                "requests",
                "p50",
                "p99",
                "max",
                f"> {millis(SLOW)}",
                "errors",
            ],
            rows=[_row(result) for result in results],
            align="lrrrrrrrr",
        ),
        notes=_verdict(results),
    )


def _bursts(starts: Sequence[float], gap: float) -> list[int]:
    """Sizes of the runs of ``starts`` (sorted) whose neighbours are less than ``gap`` apart."""
    sizes: list[int] = []
    previous = None
    for start in starts:
        if previous is None or start - previous >= gap:
            sizes.append(0)
        sizes[-1] += 1
        previous = start
    return sizes


def _row(result: _Result) -> list[str]:
    latencies = result.record.latencies
    return [
        _APPROACHES[result.phase.mode],
        f"{result.rebuilds} / {len(result.expiries)}",
        f"{result.per_expiry:.2f} / {max(result.expiries, default=0)}",
        str(len(latencies)),
        millis(median(latencies)),
        millis(percentile(latencies, 99)),
        millis(max(latencies, default=float("nan"))),
        str(result.slow),
        str(len(result.record.errors)),
    ]


def _verdict(results: Sequence[_Result]) -> list[str]:
    notes: list[str] = []
    for result in results:
        timed = len(result.record.rebuilds)
        if timed != result.rebuilds:
            notes.append(
                f"{result.phase.mode}: the Redis counter says {result.rebuilds} rebuilds, "
                f"the workers timed {timed}."
            )
        notes.extend(f"{result.phase.mode} error: {error}" for error in sorted(set(result.record.errors)))
    by_mode = {result.phase.mode: result for result in results}
    inline, background = by_mode["stampede"], by_mode["stampede-bg"]
    one_each = all(max(r.expiries, default=0) == 1 for r in (inline, background))
    notes.append(
        "Target for stampede: 1 rebuild per expiry: "
        f"{'met' if one_each else 'NOT met'} (worst expiry: inline {max(inline.expiries, default=0)}, "
        f"background {max(background.expiries, default=0)} rebuilds)."
    )
    notes.append(
        "Target with background refresh: no request waits for a rebuild: "
        f"{'met' if background.slow == 0 else 'NOT met'} ({background.slow} requests over {millis(SLOW)}, "
        f"slowest {millis(max(background.record.latencies, default=float('nan')))}). "
        f"Inline refresh makes one caller per expiry wait: {inline.slow} requests over {millis(SLOW)} "
        f"in {len(inline.expiries)} expiries."
    )
    return notes
