"""``python -m bench outage``: what callers see while Redis goes away and comes back, stampede
beside its stock peers.

Four faults, each in three phases (5 s up, 10 s of fault, 5 s back): ``kill`` stops the
redis-server (connections refused) and starts it again, empty, on its port; ``blackhole`` freezes
it with SIGSTOP (connections are made, nothing answers: a firewall dropping packets, a hung host)
and thaws it with SIGCONT; ``slow`` holds every reply back 300 ms in a proxy on the way (a busy
server, a saturated link), then lets them through at once again; ``full`` empties it and sets
``maxmemory`` to 1 byte under ``noeviction`` (every write refused with ``OOM``, every key to be
made again), then lifts the limit. Every cache is given a socket timeout and a connect timeout of
1 s, its own way, and a fresh redis-server per run.

- The sites: a Django view under Django's own ``cache_page``, and a Flask view under the cache's
  own decorator (a render of 0.2 s, counted in a file), served by gunicorn gthread (else
  waitress) in a process of their own, read by 30 client threads on keep-alive connections. On
  Django: Django's ``RedisCache`` (which raises when Redis is away), django-redis with
  ``IGNORE_EXCEPTIONS`` and ``StampedeCache`` with ``FAIL_OPEN``; on Flask: Flask-Caching's
  ``@cache.cached`` on its own ``RedisCache`` (its decorators log a backend's errors and render)
  and on ``flask_stampede.StampedeCache`` with ``fail_open``, and ``flask_stampede``'s
  ``@stampede.cached`` with ``STAMPEDE_FAIL_OPEN``.
- The core: no web server; 16 threads call ``get_or_rebuild`` on 20 keys (a rebuild of 10 ms)
  through stampede's ``Stampede`` with ``fail_open=True``, beside dogpile.cache's
  ``get_or_create`` on its Redis backend.

Per cache, fault and phase: the requests (or calls) counted in it, those answered other than 200
and those that got no answer (or raised), their median, slowest 1% and slowest time, and the
renders (rebuilds) begun per second. A request is counted in the fault's phase if it was under
way at any moment of the fault (begun before Redis came back, ended after the fault began),
else in the phase it began in. A peer that is not installed is left out with a note.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import time
from collections.abc import Callable, Mapping, Sequence

from support.app_servers import AppServerError, Server

from .._common import servers
from .._common.installed import importable
from .._common.report import Section, Table, environment_line, progress, render_section
from ..load._apps.outage_config import CACHES, FLASK_CACHES, CacheName
from ._outage_core import CORE_PEERS, CorePeer, call_through
from ._outage_site import PATIENCE, WARMUP, serve_through, site_server
from ._outages import DOING, FAULTS, PHASES, Fault, Phase, Plan, Tally, tally

__all__ = ["PARTS", "main", "run"]

PARTS = ("site", "core")
PLAN = Plan(up=5.0, fault=10.0, back=5.0)
#: Every cache's socket timeout and connect timeout, in seconds.
SOCKET_TIMEOUT = 1.0
#: The site: clients, and the render of its page.
CLIENTS = 30
RENDER_SECONDS = 0.2
#: The core: threads, keys, a rebuild, and the seconds of calls before the first phase.
THREADS = 16
KEYS = 20
REBUILD_SECONDS = 0.01
CORE_WARMUP = 1.0

Log = Callable[[str], None]

LABELS: dict[CacheName, str] = {
    "django": "Django `RedisCache`",
    "django-redis": "django-redis, `IGNORE_EXCEPTIONS`",
    "stampede": "`StampedeCache`, `FAIL_OPEN`",
    "flask-caching": "Flask-Caching `RedisCache`",
    "flask-caching-stampede": "Flask-Caching on `flask_stampede.StampedeCache`, `fail_open`",
    "flask-stampede": "`flask_stampede` `@stampede.cached`, `STAMPEDE_FAIL_OPEN`",
}
#: The module each cache needs, besides Django.
MODULES: dict[CacheName, str] = {
    "django": "django",
    "django-redis": "django_redis",
    "stampede": "django_stampede",
    "flask-caching": "flask_caching",
    "flask-caching-stampede": "flask_caching",
    "flask-stampede": "flask_stampede",
}
DISTRIBUTIONS = ("Django", "django-redis", "Flask", "Flask-Caching", "dogpile.cache", "redis")


def _versions() -> str:
    found = []
    for name in DISTRIBUTIONS:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return ", ".join(found)


# --- the site -------------------------------------------------------------------------------


def site(plan: Plan, caches: Sequence[CacheName], faults: Sequence[Fault], log: Log) -> list[Section]:
    """One section per fault and framework: every cache's site through it, phase by phase."""
    server = site_server(CLIENTS)
    if server is None:
        log("outage site: skipped, neither gunicorn nor waitress is installed")
        return []
    sections = []
    for framework in FRAMEWORKS:
        ours = [cache for cache in caches if (cache in FLASK_CACHES) == (framework == "Flask")]
        if not ours:
            continue
        if not importable(framework.lower()):
            log(f"outage site: {framework} skipped, it is not installed")
            continue
        notes: list[str] = []
        present: list[CacheName] = []
        for cache in ours:
            if importable(MODULES[cache]):
                present.append(cache)
            else:
                notes.append(f"{LABELS[cache]}: `{MODULES[cache]}` is not installed; its rows are left out.")
        sections += [_site_section(framework, fault, plan, server, present, notes, log) for fault in faults]
    return sections


#: The sites, each a section per fault.
FRAMEWORKS = ("Django", "Flask")
#: How each site's page is cached, for the sections' introductions.
CACHED_BY = {
    "Django": "A sync Django view under Django's `cache_page`",
    "Flask": "A Flask view under the cache's own decorator (Flask-Caching's `@cache.cached`, "
    "`flask_stampede`'s `@stampede.cached`)",
}


def _site_section(
    framework: str,
    fault: Fault,
    plan: Plan,
    server: Server,
    present: Sequence[CacheName],
    notes: Sequence[str],
    log: Log,
) -> Section:
    rows: list[list[str]] = []
    fault_notes = list(notes)
    for cache in present:
        log(f"outage site, {fault}, {cache}: running")
        try:
            ran = serve_through(
                cache,
                fault,
                plan,
                server=server,
                clients=CLIENTS,
                render_seconds=RENDER_SECONDS,
                socket_timeout=SOCKET_TIMEOUT,
                log=log,
            )
        except (AppServerError, RuntimeError) as exc:
            log(f"outage site, {fault}, {cache}: {exc}")
            rows.append([LABELS[cache], f"failed: {str(exc).splitlines()[0]}", *([""] * 7)])
            continue
        phases = tally(ran.samples, ran.renders, ran.bounds)
        log(f"outage site, {fault}, {cache}: {_describe(phases)}")
        rows += [_site_row(LABELS[cache], phase, phases[phase]) for phase in PHASES]
        fault_notes += _outcome_notes(LABELS[cache], phases, http=True)
        if ran.server_errors:
            shown = ", ".join(f"{count} x {name}" for name, count in ran.server_errors.most_common(3))
            fault_notes.append(f"{LABELS[cache]}: the server logged {shown}.")
    headers = ["cache", "phase", "answered", "non-200", "no answer", "p50", "p99", "max", "renders/s"]
    intro = (
        f"{CACHED_BY[framework]} (a render of {RENDER_SECONDS * 1000:.0f} ms, "
        f"no expiry within the run), {server.described}; {CLIENTS} client threads, each on a "
        f"keep-alive connection, ask for it one request after another (a client waits "
        f"{PATIENCE:g} s for an answer). Fault: {DOING[fault]}. {_phases(plan, WARMUP)} A request "
        "under way at any moment of the fault is counted in the fault's phase, any "
        "other in the phase it began in; its time runs from sent to answered (or failed). Renders/s: the "
        "renders begun in the phase over its length. Socket and connect timeouts "
        f"{SOCKET_TIMEOUT:g} s for every cache; each on a fresh redis-server and a fresh server. "
        f"{_versions()}."
    )
    table = Table(headers, rows, "ll" + "r" * (len(headers) - 2))
    title = f"{_fault_title(fault)}: a cached {framework} page under {server.name}"
    return Section(title, intro, table, fault_notes)


def _site_row(label: str, phase: Phase, counted: Tally) -> list[str]:
    return [
        label,
        phase,
        str(counted.count - counted.unanswered),
        str(counted.failed),
        str(counted.unanswered),
        _duration(counted.latency(50)),
        _duration(counted.latency(99)),
        _duration(counted.slowest),
        f"{counted.render_rate:.1f}",
    ]


# --- the core -------------------------------------------------------------------------------


def core(plan: Plan, peers: Sequence[CorePeer], faults: Sequence[Fault], log: Log) -> list[Section]:
    """One section per fault: every core peer's callers through it, phase by phase."""
    notes: list[str] = []
    present: list[CorePeer] = []
    for peer in peers:
        if missing := peer.missing():
            notes.append(f"{peer.label}: {', '.join(missing)} not installed; its rows are left out.")
        else:
            present.append(peer)
    sections = []
    for fault in faults:
        rows: list[list[str]] = []
        fault_notes = list(notes)
        for peer in present:
            log(f"outage core, {fault}, {peer.name}: running")
            ran = call_through(
                peer,
                fault,
                plan,
                threads=THREADS,
                keys=KEYS,
                rebuild_seconds=REBUILD_SECONDS,
                socket_timeout=SOCKET_TIMEOUT,
                warmup=CORE_WARMUP,
                log=log,
            )
            phases = tally(ran.samples, ran.rebuilds, ran.bounds)
            log(f"outage core, {fault}, {peer.name}: {_describe(phases)}")
            rows += [_core_row(peer.label, phase, phases[phase]) for phase in PHASES]
            fault_notes += _outcome_notes(peer.label, phases, http=False)
        headers = ["cache", "phase", "calls", "errors", "p50", "p99", "max", "rebuilds/s"]
        intro = (
            f"No web server: {THREADS} threads of one process call the cache's get-or-rebuild on "
            f"{KEYS} keys in turn (a rebuild of {REBUILD_SECONDS * 1000:.0f} ms; every key cached "
            f"before the start, fresh for the whole run). Fault: {DOING[fault]}. "
            f"{_phases(plan, CORE_WARMUP)} "
            "A call under way at any moment of the fault is counted in the fault's "
            "phase, any other in the phase it began in; errors: calls that raised; rebuilds/s: the "
            "rebuilds begun in the phase over its length. Socket and connect timeouts "
            f"{SOCKET_TIMEOUT:g} s; each cache on a fresh redis-server. {_versions()}."
        )
        table = Table(headers, rows, "ll" + "r" * (len(headers) - 2))
        sections.append(Section(f"{_fault_title(fault)}: the core, no web server", intro, table, fault_notes))
    return sections


def _core_row(label: str, phase: Phase, counted: Tally) -> list[str]:
    return [
        label,
        phase,
        str(counted.count),
        str(counted.failed + counted.unanswered),
        _duration(counted.latency(50)),
        _duration(counted.latency(99)),
        _duration(counted.slowest),
        f"{counted.render_rate:.1f}",
    ]


# --- shared ---------------------------------------------------------------------------------


def _fault_title(fault: Fault) -> str:
    if fault == "slow":
        return "Redis slow (+300 ms a reply)"
    if fault == "full":
        return "Redis full (`OOM`, emptied)"
    return f"Redis away ({fault})"


def _phases(plan: Plan, warmup: float) -> str:
    return (
        f"Phases: up {plan.up:g} s (after {warmup:g} s of uncounted warm-up), fault {plan.fault:g} s "
        f"(until Redis answers again), back {plan.back:g} s."
    )


def _outcome_notes(label: str, phases: Mapping[Phase, Tally], *, http: bool) -> list[str]:
    """A note per phase whose samples did not all come to 200 (``ok``): what they came to."""
    notes = []
    good = "200" if http else "ok"
    for phase, counted in phases.items():
        outcomes = counted.outcomes()
        if set(outcomes) - {good}:
            ranked = sorted(outcomes.items(), key=lambda item: -item[1])
            shown = ", ".join(f"{count} x {name}" for name, count in ranked)
            notes.append(f"{label}, {phase}: {shown}.")
    return notes


def _describe(phases: Mapping[Phase, Tally]) -> str:
    return "; ".join(
        f"{phase} {counted.count} ({counted.failed + counted.unanswered} failed), "
        f"p99 {_duration(counted.latency(99))}, {counted.render_rate:.1f} renders/s"
        for phase, counted in phases.items()
    )


def _duration(seconds: float) -> str:
    if math.isnan(seconds):
        return "n/a"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def run(
    *,
    plan: Plan = PLAN,
    parts: Sequence[str] = PARTS,
    caches: Sequence[CacheName] = CACHES,
    faults: Sequence[Fault] = FAULTS,
    log: Log = progress,
) -> list[Section]:
    """The sections of the ``parts`` asked for: the site's, then the core's."""
    sections: list[Section] = []
    if "site" in parts:
        sections += site(plan, caches, faults, log)
    if "core" in parts:
        sections += core(plan, CORE_PEERS, faults, log)
    return sections


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench outage",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--up", type=float, default=PLAN.up, help="seconds up before the fault (default 5)")
    parser.add_argument("--down", type=float, default=PLAN.fault, help="seconds Redis is away (default 10)")
    parser.add_argument("--back", type=float, default=PLAN.back, help="seconds after it is back (default 5)")
    parser.add_argument("--quick", action="store_true", help="halve the three durations")
    parser.add_argument("--part", action="append", choices=PARTS, help="site or core (repeatable)")
    parser.add_argument(
        "--fault", action="append", choices=FAULTS, help="kill, blackhole, slow or full (repeatable)"
    )
    parser.add_argument("--cache", action="append", choices=CACHES, help="the site's caches (repeatable)")
    args = parser.parse_args(argv)
    plan = Plan(args.up, args.down, args.back)
    if args.quick:
        plan = plan.halved()
    started = time.monotonic()
    sections = run(
        plan=plan,
        parts=args.part or PARTS,
        caches=args.cache or CACHES,
        faults=args.fault or FAULTS,
    )
    print(environment_line(servers.default_version(), quick=args.quick), end="\n\n")
    print("\n\n".join(render_section(section) for section in sections))
    progress(f"{len(sections)} section(s) in {time.monotonic() - started:.0f} s")
