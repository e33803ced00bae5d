"""Scenario 3: a hot key that expires every second, under 64 callers looping requests.

Every peer with a 1 s TTL; the peers that can serve a stale value
(stampede, dogpile) keep it 30 s longer while one caller refreshes, and
stampede also runs with ``background=True``. Rebuilds are grouped into
expiries by their start times: rebuilds less than half a TTL apart belong to
the same expiry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .._common.phase import Phase, PhaseResult
from .._common.report import Section, Table, millis
from .._common.stats import median, percentile
from .._common.workload import REBUILD_SECONDS, key_prefix
from ..peers import STALE_TTL, PeerSpec, spec
from .summary import Figures

__all__ = ["TTL", "phases", "section"]

TTL = 1
#: A request slower than this waited for a rebuild (the rebuild takes 200 ms).
SLOW = 0.1


def phases(peers: Sequence[PeerSpec], run_id: str, *, duration: float, think: float) -> list[Phase]:
    prefix = f"{key_prefix(run_id)}hot:"
    variants = [(peer, False) for peer in peers]
    if any(peer.name == "stampede" for peer in peers):
        variants.append((spec("stampede"), True))
    return [
        Phase(
            "hot",
            peer.name,
            f"{prefix}{peer.name}{':background' if background else ''}",
            ttl=TTL,
            stale_ttl=STALE_TTL if peer.stale else 0,
            background=background,
            duration=duration,
            think=think,
            warm=True,  # start from a warm key, as a hot key would be: only expiries are measured
        )
        for peer, background in variants
    ]


@dataclass(frozen=True)
class _Hot:
    result: PhaseResult

    @property
    def phase(self) -> Phase:
        return self.result.phase

    @property
    def latencies(self) -> list[float]:
        return self.result.record.latencies

    @property
    def label(self) -> str:
        return spec(self.phase.peer).row_label(self.phase.row)

    @property
    def expiries(self) -> list[int]:
        """How many rebuilds each expiry caused, in order."""
        starts = sorted(start for start, _ in self.result.record.rebuilds)
        return _bursts(starts, gap=self.phase.ttl / 2)

    @property
    def per_expiry(self) -> float:
        return self.result.rebuilds / len(self.expiries) if self.expiries else float("nan")

    @property
    def worst(self) -> int:
        return max(self.expiries, default=0)

    @property
    def slow(self) -> int:
        return sum(latency > SLOW for latency in self.latencies)


def section(
    results: Sequence[PhaseResult],
    figures: Mapping[str, Figures],
    *,
    duration: float,
    think: float,
    processes: int,
    threads: int,
) -> Section:
    hots = [_Hot(result) for result in results]
    for hot in hots:
        row = figures[hot.phase.row]
        row.hot_per_expiry = hot.per_expiry
        row.hot_worst_expiry = hot.worst
        row.hot_p50 = median(hot.latencies)
        row.hot_p99 = percentile(hot.latencies, 99)
        row.hot_max = max(hot.latencies, default=float("nan"))
        row.hot_commands = hot.result.commands_per_request
    callers = processes * threads
    return Section(
        title=(
            f"3. Hot key expiring every second, {callers} callers "
            f"({processes} processes x {threads} threads or tasks)"
        ),
        intro=(
            f"The key starts warm and expires {TTL} s after each write; every caller loops requests "
            f"for {duration:g} s with a {millis(think)} pause between them; the rebuild sleeps "
            f"{millis(REBUILD_SECONDS)}. An expiry is a burst of rebuilds (rebuilds starting less than "
            f"{TTL / 2:g} s apart); a request over {millis(SLOW)} waited for a rebuild. Commands per "
            "request: the rebuild's own INCR not counted."
        ),
        table=Table(
            headers=[
                "peer",
                "rebuilds / expiries",
                "rebuilds per expiry (mean / worst)",
                "requests",
                "p50",
                "p99",
                "max",
                f"> {millis(SLOW)}",
                "commands per request",
                "errors",
            ],
            rows=[_row(hot) for hot in hots],
            align="lrrrrrrrrr",
        ),
        notes=_notes(hots),
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


def _row(hot: _Hot) -> list[str]:
    return [
        hot.label,
        f"{hot.result.rebuilds} / {len(hot.expiries)}",
        f"{hot.per_expiry:.2f} / {hot.worst}",
        str(len(hot.latencies)),
        millis(median(hot.latencies)),
        millis(percentile(hot.latencies, 99)),
        millis(max(hot.latencies, default=float("nan"))),
        str(hot.slow),
        f"{hot.result.commands_per_request:.2f}",
        str(len(hot.result.record.errors)),
    ]


def _notes(hots: Sequence[_Hot]) -> list[str]:
    notes: list[str] = []
    for hot in hots:
        timed = len(hot.result.record.rebuilds)
        if timed != hot.result.rebuilds:
            notes.append(
                f"{hot.label}: the Redis counter says {hot.result.rebuilds} rebuilds, "
                f"the workers timed {timed}."
            )
        notes.extend(f"{hot.label} error: {error}" for error in sorted(set(hot.result.record.errors)))
    rows = {hot.phase.row: hot for hot in hots}
    inline = [
        rows[name]
        for name in ("stampede", "stampede-asyncio", "stampede-near", "stampede-asyncio-near")
        if name in rows
    ]
    background = rows.get("stampede+background")
    checked = [*inline, *([background] if background else [])]
    if checked:
        one_each = all(hot.worst == 1 for hot in checked)
        worst = "; ".join(f"{hot.label}: {hot.worst}" for hot in checked)
        notes.append(
            f"Target for stampede: 1 rebuild per expiry: {'met' if one_each else 'NOT met'} "
            f"(worst expiry: {worst})."
        )
    if background is not None:
        notes.append(
            "Target with background refresh: no request waits for a rebuild: "
            f"{'met' if background.slow == 0 else 'NOT met'} "
            f"({background.slow} requests over {millis(SLOW)}, "
            f"slowest {millis(max(background.latencies, default=float('nan')))})."
        )
    for hot in inline:
        notes.append(
            f"{hot.label} refreshes inline, so one caller per expiry waits: {hot.slow} requests over "
            f"{millis(SLOW)} in {len(hot.expiries)} expiries."
        )
    return notes
