"""The side-by-side table: one row per peer (and per variant of one), the headline figures of
every scenario, and under it how each peer was configured.

Each scenario fills in its columns of the rows (:class:`Figures`);
:func:`section` renders them; :mod:`bench.herd.plot` draws them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from .._common.report import Section, Table, millis
from .._common.workload import REBUILD_SECONDS
from ..peers import WHY

__all__ = ["Figures", "observations", "section"]

NAN = float("nan")


@dataclass
class Figures:
    """The headline figures of one row; NaN (or empty) where a scenario did not run.

    Attributes:
        row: the row's key (``peer`` or ``peer+background``).
        label: its name in the tables; ``short``: on the plot.
        cold_rebuilds: rebuilds in each cold-key trial.
        cold_slowest: the slowest cold-key caller of the worst trial, seconds.
        cold_commands / hot_commands: Redis commands per request.
        hot_per_expiry / hot_worst_expiry: rebuilds per expiry of the hot key, mean and worst.
        hot_p50 / hot_p99 / hot_max: request latency on the hot key, seconds.
        hit_ratio: a hit's median cost over a plain GET + unpickle's; ``hit_commands``: per hit.
    """

    row: str
    label: str
    short: str
    highlight: bool = False
    cold_rebuilds: list[int] = field(default_factory=list)
    cold_slowest: float = NAN
    cold_commands: float = NAN
    hot_per_expiry: float = NAN
    hot_worst_expiry: int = 0
    hot_p50: float = NAN
    hot_p99: float = NAN
    hot_max: float = NAN
    hot_commands: float = NAN
    hit_ratio: float = NAN
    hit_commands: float = NAN


def _number(value: float, digits: int = 2) -> str:
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}"


def _row(figures: Figures) -> list[str]:
    cold = (
        f"{max(figures.cold_rebuilds)} / {millis(figures.cold_slowest)}" if figures.cold_rebuilds else "n/a"
    )
    per_expiry = (
        "n/a"
        if math.isnan(figures.hot_per_expiry)
        else f"{figures.hot_per_expiry:.2f} / {figures.hot_worst_expiry}"
    )
    return [
        figures.label,
        cold,
        per_expiry,
        millis(figures.hot_p50),
        millis(figures.hot_p99),
        millis(figures.hot_max),
        f"{_number(figures.hot_commands)} / {_number(figures.cold_commands)}",
        "n/a" if math.isnan(figures.hit_ratio) else f"{figures.hit_ratio:.2f}x",
    ]


def section(figures: Sequence[Figures], *, hot_ttl: int, shared: bool, notes: Sequence[str]) -> Section:
    servers = "all against one Redis" if shared else "each against a fresh redis-server of its own"
    return Section(
        title="Side by side",
        intro=(
            f"Every peer in this one run, {servers}; the details of each "
            "scenario follow. Cold key: 64 callers ask for a missing key at once (rebuilds in the worst "
            f"trial / its slowest caller). Hot key: 64 callers loop on a key that expires every {hot_ttl} s "
            "(rebuilds per expiry, mean / worst; request latency). Commands: from the server's "
            "`INFO stats`, per request. Hit: the median cost of a hit over a plain `GET` + `pickle.loads`. "
            "n/a: not measured, the scenario not run or not one the peer takes part in (see its notes)."
        ),
        table=Table(
            headers=[
                "peer",
                "cold: rebuilds / slowest",
                "hot: rebuilds per expiry",
                "hot p50",
                "hot p99",
                "hot max",
                "commands per request (hot / cold)",
                "hit vs GET",
            ],
            rows=[_row(f) for f in figures],
            align="lrrrrrrr",
        ),
        notes=notes,
    )


def observations(figures: Sequence[Figures], *, callers: int) -> list[str]:
    """What stands out in the figures: one line per row with findings, and why where it is known."""
    found: list[str] = []
    for f in figures:
        why = WHY.get(f.row, {})
        parts: list[tuple[str, str]] = []  # (finding, the WHY entry that explains it)
        worst_cold = max(f.cold_rebuilds, default=0)
        if f.hot_worst_expiry > 1 or worst_cold > 1:
            counts = []
            if worst_cold > 1:
                counts.append(f"{worst_cold} rebuilds of the cold key")
            if f.hot_worst_expiry > 1:
                counts.append(f"up to {f.hot_worst_expiry} per expiry of the hot key")
            parts.append((f"{' and '.join(counts)}, for {callers} callers", "rebuilds"))
        late = f.cold_slowest - REBUILD_SECONDS
        if worst_cold == 1 and late > 0.05:
            parts.append(
                (
                    f"one rebuild of the cold key, but its slowest caller had the value {millis(late)} "
                    "after it",
                    "waiters",
                )
            )
        if f.hot_worst_expiry == 1 and f.hot_p99 > REBUILD_SECONDS / 2:
            parts.append(
                (
                    "one rebuild per expiry, yet over 1% of the hot key's requests waited for it "
                    f"(p99 {millis(f.hot_p99)}, max {millis(f.hot_max)})",
                    "expiry",
                )
            )
        if f.hit_ratio > 1.5:
            commands = "" if math.isnan(f.hit_commands) else f" and {f.hit_commands:.0f} command(s)"
            parts.append((f"a hit costs {f.hit_ratio:.2f}x a plain `GET` + unpickle{commands}", "hit"))
        if parts:
            said = "; ".join(f"{what} ({why[key]})" if key in why else what for what, key in parts)
            found.append(f"{f.label}: {said}.")
    return found
