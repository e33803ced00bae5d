"""The PNG: four panels, one bar (or pair of bars) per peer, labelled with the date and machine.

matplotlib is imported only when drawing, so the tables need nothing beyond
the peers themselves; it draws off-screen (the Agg backend).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .summary import Figures

__all__ = ["draw"]

#: The two series of a panel: a light and a dark shade of one colour per panel.
_COLOURS = {
    "rebuilds": ("#f4a582", "#ca0020"),
    "latency": ("#92c5de", "#0571b0"),
    "commands": ("#a6dba0", "#008837"),
    "hit": ("#c2a5cf", "#7b3294"),
}


def _label(value: float, unit: str) -> str:
    if math.isnan(value):
        return "n/a"
    if unit == "ms":
        return f"{value:.1f} ms" if value < 100 else f"{value:.0f} ms"
    if unit == "x":
        return f"{value:.2f}x"
    return f"{value:.2f}".rstrip("0").rstrip(".") if value < 10 else f"{value:.0f}"


def _bars(
    ax: Any,
    figures: Sequence[Figures],
    series: Sequence[tuple[str, list[float]]],
    colours: tuple[str, str],
    *,
    unit: str,
    log: bool,
) -> None:
    """Horizontal bars, one group per row; missing values (NaN, or not positive on a log scale)
    get no bar but an "n/a"."""
    height = 0.8 / len(series)
    shades = colours if len(series) > 1 else colours[1:]
    drawn: list[float] = []
    labels: list[tuple[float, float, str]] = []  # (value or NaN, offset, text)
    for position, ((name, values), colour) in enumerate(zip(series, shades, strict=True)):
        offsets = [row - 0.4 + height * (position + 0.5) for row in range(len(figures))]
        widths = [v if not math.isnan(v) and (v > 0 or not log) else math.nan for v in values]
        ax.barh(offsets, [0 if math.isnan(w) else w for w in widths], height=height, color=colour, label=name)
        drawn.extend(w for w in widths if not math.isnan(w))
        labels.extend((w, o, _label(v, unit)) for w, o, v in zip(widths, offsets, values, strict=True))
    if not drawn:
        ax.text(0.5, 0.5, "not measured in this run", transform=ax.transAxes, ha="center", color="grey")
    elif log:
        ax.set_xscale("log")
        ax.set_xlim(left=min([*drawn, 1.0]) / 2, right=max([*drawn, 1.0]) * 4)
    else:
        ax.set_xlim(left=0, right=max([*drawn, 1.0]) * 1.25)
    left = ax.get_xlim()[0]
    for width, offset, text in labels:
        ax.annotate(
            text,
            (left if math.isnan(width) else width, offset),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=7,
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.8},
        )
    ax.set_yticks(range(len(figures)))
    ax.set_yticklabels([f.short for f in figures], fontsize=8)
    for tick, row in zip(ax.get_yticklabels(), figures, strict=True):
        if row.highlight:
            tick.set_fontweight("bold")
    ax.invert_yaxis()
    ax.grid(axis="x", which="major", alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=7, loc="lower right")


def draw(figures: Sequence[Figures], *, environment: str, path: Path, hot_ttl: int) -> Path:
    """Draw the four panels of ``figures`` to ``path`` (a PNG); returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(14, 8.5), constrained_layout=True)
    rebuilds, latency, commands, hit = axes.flat

    _bars(
        rebuilds,
        figures,
        [
            (
                "cold key: rebuilds in the worst trial",
                [float(max(f.cold_rebuilds, default=math.nan)) for f in figures],
            ),
            (f"hot key: rebuilds per expiry ({hot_ttl} s TTL), mean", [f.hot_per_expiry for f in figures]),
        ],
        _COLOURS["rebuilds"],
        unit="",
        log=True,
    )
    rebuilds.set_title("Rebuilds per expiry, 64 callers (lower is better; 1 is ideal)", fontsize=10)
    rebuilds.set_xlabel("rebuilds (log scale)")

    _bars(
        latency,
        figures,
        [
            ("p99", [f.hot_p99 * 1000 for f in figures]),
            ("max", [f.hot_max * 1000 for f in figures]),
        ],
        _COLOURS["latency"],
        unit="ms",
        log=True,
    )
    latency.set_title("Hot key: request latency, p99 and max (lower is better)", fontsize=10)
    latency.set_xlabel("milliseconds (log scale); the rebuild itself takes 200 ms")

    _bars(
        commands,
        figures,
        [
            ("cold key", [f.cold_commands for f in figures]),
            ("hot key", [f.hot_commands for f in figures]),
        ],
        _COLOURS["commands"],
        unit="",
        log=False,
    )
    commands.set_title("Redis commands per request (from INFO stats)", fontsize=10)
    commands.set_xlabel("commands per request")

    _bars(hit, figures, [("hit", [f.hit_ratio for f in figures])], _COLOURS["hit"], unit="x", log=False)
    hit.axvline(1.0, color="black", linewidth=0.8)
    hit.axvline(1.1, color="black", linewidth=0.8, linestyle=":")
    hit.set_title("Hit cost vs a plain GET + unpickle (1.0 = the same; dotted: 1.1)", fontsize=10)
    hit.set_xlabel("ratio of median times per call")

    fig.suptitle(f"stampede and the alternatives, side by side\n{environment}", fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
