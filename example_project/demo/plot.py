"""The PNG: per app, requests per second, latency and runs of the expensive
code over time, then what the Redis saw meanwhile (commands per second and the
app servers' connections), the stock cache and stampede on the same axes."""

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
    from matplotlib.ticker import MaxNLocator

    apps = list(dict.fromkeys(run.app for run in runs))
    figure, axes = plt.subplots(
        5, len(apps), figsize=(7.0 * len(apps), 14.5), sharex=True, squeeze=False, constrained_layout=True
    )
    for column, app in enumerate(apps):
        rate, latency, rebuilds, commands, clients = (axes[row][column] for row in range(5))
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
            # Each sample's figure over the interval before it, drawn at the interval's middle.
            samples = [s for s in run.redis_samples if s.at - s.interval / 2 < run.duration]
            middles = [s.at - s.interval / 2 for s in samples]
            total = sum(s.commands for s in run.redis_samples)  # as the JSON and the tables count
            per_request = f", {total / len(run.requests):.1f} per request" if run.requests else ""
            commands.plot(
                middles,
                [s.commands_per_second for s in samples],
                color=colour,
                label=f"{label}: {total:,} commands{per_request}",
            )
            clients.plot(
                [s.at for s in samples],
                [s.clients for s in samples],
                color=colour,
                drawstyle="steps-post",
                label=f"{label}: at most {max((s.clients for s in run.redis_samples), default=0)}",
            )
        rate.set_title(f"{app}: requests per second")
        latency.set_title(f"{app}: latency per {BIN_SECONDS:g} s (ms, log scale)")
        latency.set_yscale("log")
        rebuilds.set_title(f"{app}: runs of the expensive code, by the time they began")
        commands.set_title(f"{app}: Redis commands per second (INFO stats, the demo's own not counted)")
        clients.set_title(f"{app}: Redis connections of the app servers (INFO clients: connected_clients)")
        commands.set_ylim(bottom=0)
        clients.set_ylim(bottom=0)
        clients.yaxis.set_major_locator(MaxNLocator(integer=True))
        clients.set_xlabel("seconds since the stampede began")
        for axis in (rate, latency, rebuilds, commands, clients):
            axis.grid(True, alpha=0.3)
            # The Redis curves peak anywhere: their legends go where they hide least.
            axis.legend(fontsize="small", loc="upper right" if axis in (rate, latency, rebuilds) else "best")
    figure.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
