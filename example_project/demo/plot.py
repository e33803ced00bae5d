"""The PNG: per app, requests per second, latency and runs of the expensive
code over time, the stock cache and stampede on the same axes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from .report import Run, percentile

__all__ = ["BIN_SECONDS", "plot"]

#: The width of the time bins the curves are drawn from.
BIN_SECONDS = 0.5
COLOURS = {"stock": "#d62728", "stampede": "#2ca02c"}


def _bins(duration: float) -> int:
    return max(1, math.ceil(duration / BIN_SECONDS))


def plot(runs: Sequence[Run], path: Path, title: str) -> None:
    """Draw ``runs`` into ``path``; needs matplotlib (the ``demo`` extra)."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    apps = list(dict.fromkeys(run.app for run in runs))
    figure, axes = plt.subplots(
        3, len(apps), figsize=(7.0 * len(apps), 9.0), sharex=True, squeeze=False, constrained_layout=True
    )
    for column, app in enumerate(apps):
        rate, latency, rebuilds = axes[0][column], axes[1][column], axes[2][column]
        app_runs = [run for run in runs if run.app == app]
        width = BIN_SECONDS / (len(app_runs) + 1)
        for offset, run in enumerate(app_runs):
            colour = COLOURS.get(run.cache, None)
            label = "stampede" if run.cache == "stampede" else "stock Redis cache"
            count = _bins(run.duration)
            starts = [i * BIN_SECONDS for i in range(count)]
            per_bin: list[list[float]] = [[] for _ in range(count)]
            for request in run.requests:
                if request.error is None and 0 <= request.sent < run.duration:
                    per_bin[int(request.sent / BIN_SECONDS)].append(request.latency * 1000)
            # Requests are placed by when they were sent, so a wait shows where it began.
            rate.plot(starts, [len(b) / BIN_SECONDS for b in per_bin], color=colour, label=label)
            # p95 shows how many requests waited; the slowest alone would not
            # (stampede's one refreshing request per expiry waits too).
            p95 = [percentile(b, 0.95) for b in per_bin]
            worst = [max(b) if b else math.nan for b in per_bin]
            # Markers: a bin between two empty ones (everyone waiting) has no line to draw.
            latency.plot(starts, p95, color=colour, marker="o", markersize=2.5, label=f"{label}: p95")
            latency.plot(starts, worst, color=colour, linewidth=0.8, alpha=0.4, label=f"{label}: slowest")
            runs_per_bin = [0] * count
            for _, at in run.expensive_runs:
                if 0 <= at < run.duration:
                    runs_per_bin[int(at / BIN_SECONDS)] += 1
            rebuilds.bar(
                [s + (offset + 0.5) * width for s in starts],
                runs_per_bin,
                width=width,
                color=colour,
                label=f"{label}: {len(run.expensive_runs)} runs",
            )
        rate.set_title(f"{app}: requests per second")
        latency.set_title(f"{app}: latency per {BIN_SECONDS:g} s (ms, log scale)")
        latency.set_yscale("log")
        rebuilds.set_title(f"{app}: runs of the expensive code, by the time they began")
        rebuilds.set_xlabel("seconds since the stampede began")
        for axis in (rate, latency, rebuilds):
            axis.grid(True, alpha=0.3)
            axis.legend(fontsize="small", loc="upper right")
    figure.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
