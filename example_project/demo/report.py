"""What one run measured, summed up per page, and the tables the demo prints."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from .load import Request
from .sampler import RedisSample

__all__ = ["Run", "Summary", "percentile", "render_tables", "summarise"]

#: A response whose content is older than the TTL by more than this was served stale.
#: (A fresh page is stored a few milliseconds after its content is built; a stale
#: one is at least that old for the whole rebuild.)
STALE_MARGIN = 0.02


@dataclass(frozen=True)
class Run:
    """One app served with one cache for the whole duration."""

    app: str
    cache: str
    duration: float
    ttl: float
    rebuild_time: float
    requests: Sequence[Request]
    #: (page, seconds since the run started) of every run of the expensive code.
    expensive_runs: Sequence[tuple[str, float]]
    #: What the Redis saw meanwhile, every :data:`~.sampler.SAMPLE_SECONDS`.
    redis_samples: Sequence[RedisSample] = ()
    #: connected_clients before the app servers started (subtracted from the samples').
    baseline_clients: int = 0

    def redis_figures(self) -> dict[str, object]:
        """The Redis samples and their totals, for the JSON."""
        commands = sum(s.commands for s in self.redis_samples)
        requests = len(self.requests)
        return {
            "app": self.app,
            "cache": self.cache,
            "baseline_clients": self.baseline_clients,
            "commands": commands,
            "requests": requests,
            "commands_per_request": round(commands / requests, 3) if requests else None,
            "max_clients": max((s.clients for s in self.redis_samples), default=None),
            "samples": [s.as_dict() for s in self.redis_samples],
        }


@dataclass(frozen=True)
class Summary:
    app: str
    cache: str
    page: str
    requests: int
    expensive_runs: int
    stale: int
    slow: int
    errors: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (``fraction`` 0.99: p99); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def summarise(run: Run) -> list[Summary]:
    """One summary per page of ``run``, then one for all its pages."""
    pages = sorted({r.page for r in run.requests} | {page for page, _ in run.expensive_runs})
    return [_summary(run, page) for page in pages] + [_summary(run, None)]


def _summary(run: Run, page: str | None) -> Summary:
    requests = [r for r in run.requests if page is None or r.page == page]
    latencies = [r.latency * 1000 for r in requests if r.error is None]
    return Summary(
        app=run.app,
        cache=run.cache,
        page=page or "all",
        requests=len(requests),
        expensive_runs=sum(1 for p, _ in run.expensive_runs if page is None or p == page),
        stale=sum(1 for r in requests if r.age is not None and r.age > run.ttl + STALE_MARGIN),
        slow=sum(1 for r in requests if r.error is None and r.latency >= run.rebuild_time / 2),
        errors=sum(1 for r in requests if r.error is not None),
        p50_ms=percentile(latencies, 0.50),
        p99_ms=percentile(latencies, 0.99),
        max_ms=max(latencies, default=math.nan),
    )


def _ms(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:,.1f}"


HEADERS = (
    "page",
    "cache",
    "requests",
    "expensive runs",
    "stale",
    "slow",
    "p50 ms",
    "p99 ms",
    "max ms",
    "errors",
)


def render_tables(summaries: Sequence[Summary]) -> str:
    """A plain-text table per app, stock and stampede rows side by side per page."""
    out: list[str] = []
    for app in dict.fromkeys(s.app for s in summaries):
        rows = [
            (
                s.page,
                s.cache,
                f"{s.requests:,}",
                f"{s.expensive_runs:,}",
                f"{s.stale:,}",
                f"{s.slow:,}",
                _ms(s.p50_ms),
                _ms(s.p99_ms),
                _ms(s.max_ms),
                f"{s.errors:,}",
            )
            for s in sorted((s for s in summaries if s.app == app), key=lambda s: (s.page == "all", s.page))
        ]
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(HEADERS)]

        out += [
            app,
            _line(HEADERS, widths),
            _line(["-" * w for w in widths], widths),
            *(_line(row, widths) for row in rows),
            "",
        ]
    return "\n".join(out)


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    """Page and cache left-aligned, the figures right-aligned."""
    return "  ".join(
        cell.ljust(width) if i < 2 else cell.rjust(width)
        for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
    )
