"""Scenario 1: what a hit costs through each peer, against a plain GET + unpickle on the same client.

A single caller (one thread or one task of one worker process; every other
caller idles) times a fresh key holding a small dict. Each of ``rounds``
rounds makes ``calls`` calls per variant, in chunks of :data:`CHUNK` calls
that alternate between the peer and the baseline (so a noisy neighbour or a
frequency change hits both alike), with the order rotating every round; each
variant's result is the median of its per-call times over the rounds. The
timing loops (:mod:`bench._common.timing`) run in the worker
(:mod:`bench.herd._workers`); :func:`section` turns the results into the table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from .._common.phase import Phase, PhaseResult
from .._common.report import Section, Table, micros
from .._common.stats import median
from .._common.workload import key_prefix
from ..peers import STALE_TTL, PeerSpec, spec
from .summary import Figures

__all__ = ["BASELINE", "CHUNK", "PEER", "calls_made", "phases", "section"]

TTL = 3600
CHUNK = 250
#: The target: a stampede hit costs at most this much more than the baseline.
TARGET_RATIO = 1.1

BASELINE = "baseline"
PEER = "peer"


def phases(peers: Sequence[PeerSpec], run_id: str, *, rounds: int, calls: int) -> list[Phase]:
    prefix = f"{key_prefix(run_id)}hit:"
    return [
        Phase(
            "hit",
            peer.name,
            f"{prefix}{peer.name}",
            ttl=TTL,
            stale_ttl=STALE_TTL if peer.stale else 0,
            warm=True,
            rounds=rounds,
            calls=calls,
        )
        for peer in peers
    ]


# --- in the worker -----------------------------------------------------------


def calls_made(variants: Mapping[str, object], rounds: int, calls: int) -> dict[str, int]:
    """How many calls :func:`bench._common.timing.interleave` makes of each variant: the warm-up
    chunk, then every round's."""
    return dict.fromkeys(variants, CHUNK + rounds * calls)


# --- in the parent -----------------------------------------------------------


def _commands_per_hit(result: PhaseResult) -> float:
    """Commands per peer call: the phase's commands less the baseline's one GET per call."""
    made = result.record.hit_calls
    if result.commands is None or not made.get(PEER):
        return math.nan
    return (result.commands - made.get(BASELINE, 0)) / made[PEER]


def section(results: Sequence[PhaseResult], figures: Mapping[str, Figures]) -> Section:
    rounds = results[0].phase.rounds
    calls = results[0].phase.calls
    rows: list[list[str]] = []
    verdicts: list[str] = []
    met = True
    for result in results:
        peer = spec(result.phase.peer)
        baseline = result.record.hit_times[BASELINE]
        mine = result.record.hit_times[PEER]
        ratio = median(mine) / median(baseline)
        per_round = [m / b for m, b in zip(mine, baseline, strict=True)]
        commands = _commands_per_hit(result)
        row = figures[result.phase.row]
        row.hit_ratio = ratio
        row.hit_commands = commands
        rows.append(
            [
                peer.label,
                "asyncio" if peer.is_async else "sync",
                micros(median(baseline)),
                micros(median(mine)),
                f"{ratio:.2f}x",
                f"{min(per_round):.2f}x - {max(per_round):.2f}x",
                f"{commands:.2f}",
            ]
        )
        if peer.name.startswith("stampede"):
            verdicts.append(f"{peer.label}: {ratio:.2f}x")
            met = met and round(ratio, 2) <= TARGET_RATIO  # judged as shown, to 0.01x
    notes = [
        "The baseline is `client.get(key)` + `pickle.loads` on the peer's own server, with a redis-py "
        "client of the same driver (`redis.asyncio` for the asyncio peers). Commands per hit come from "
        "the server's `total_commands_processed`, less the baseline's one `GET` per call."
    ]
    if verdicts:
        notes.append(
            f"Target: a stampede hit at most {TARGET_RATIO:.1f}x the baseline: {'met' if met else 'NOT met'} "
            f"({'; '.join(verdicts)})."
        )
    return Section(
        title="1. Hit path, one caller",
        intro=(
            f"A fresh key holding a 10-field dict; {rounds} rounds x {calls} calls per variant by a single "
            f"caller, the peer and the baseline alternating every {CHUNK} calls. Times are per call; "
            "`vs baseline` compares the medians; the range is that of the per-round ratios."
        ),
        table=Table(
            headers=[
                "peer",
                "driver",
                "baseline (median)",
                "peer hit (median)",
                "vs baseline",
                "per-round range",
                "Redis commands per hit",
            ],
            rows=rows,
            align="llrrrrr",
        ),
        notes=notes,
    )
