"""Scenario 4: many waiters. N callers of ONE process miss the same cold key at once; the render
they wait for takes 500 ms. Exactly one render should run and no caller should fail, whatever N.

Each entry point (the core's sync and asyncio calls, Django's and Flask's
cached views under a real WSGI or ASGI server) is run for each N in a cell
of its own: a fresh redis-server (unless one Redis is given), a fresh app
server process for the web entry points, always stopped. For each cell:
renders, errors, the most Redis connections open at once above the
baseline, and the slowest caller. redis-py's connection pools hold at most
100 connections by default, and raise at once when empty: a design in
which every waiting caller holds a connection breaks above 100 callers.

``python -m bench manywaiters [--n N] [--entry NAME] [--redis-url URL]``
prints the section alone; ``python -m bench herd`` runs it as its fourth.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import resource
import secrets
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis

from stampede.testing import ConnectionPeak, RedisServer
from support.app_servers import SERVERS, AppServer

from .._common.installed import importable
from .._common.report import Section, Table, environment_line, millis, progress, render_section
from .._common.workload import delete_matching, key_prefix
from ._apps import app_server, many
from ._crowd import Outcome, in_threads
from ._http import connector, getter
from ._manycore import RUNNERS
from ._renders import ENV as RENDERS_ENV
from ._renders import RENDER_SECONDS, RenderLog

__all__ = ["COUNTS", "ENTRY_POINTS", "TIMEOUT", "Cell", "EntryPoint", "callers", "main", "run"]

#: The numbers of concurrent callers, one column each.
COUNTS = (50, 150, 400)
#: Seconds a caller may take (a client's timeout, for HTTP); one that has no answer by then is an error.
TIMEOUT = 15.0
#: The file descriptors this process (and the servers it starts) may open, at least: N callers, each
#: with a socket to the app server or a Redis connection or two, must not hit a low default first.
FILE_LIMIT = 8192


@dataclass(frozen=True)
class EntryPoint:
    """One row: a way in which an application asks for the cold key.

    ``app`` is the app of :mod:`bench.load._apps.many` served under ``server`` (a
    name in :data:`support.app_servers.SERVERS`) and ``path`` the
    page asked for; without ``app``, the callers are threads or tasks of this
    process (:data:`bench.load._manycore.RUNNERS`).
    """

    name: str
    label: str
    modules: tuple[str, ...]
    config: str
    app: str = ""
    server: str = ""
    path: str = "/page"

    def missing(self) -> list[str]:
        """The modules this entry point needs that cannot be imported here."""
        return [module for module in self.modules if not importable(module)]


_DJANGO = ("django", "waitress")
_FLASK = ("flask", "flask_caching", "waitress")

ENTRY_POINTS: tuple[EntryPoint, ...] = (
    EntryPoint(
        "core-read",
        "stampede `read` + `commit`, N threads",
        ("redis",),
        "`sf = stampede.Stampede(redis.Redis.from_url(url))`; each thread: `read(key, ttl=60)`, and on "
        "a miss render, then `commit(lease, value)` if it got the lease.",
    ),
    EntryPoint(
        "core-get",
        "stampede `get_or_rebuild`, N threads",
        ("redis",),
        "The same `Stampede`; each thread: `get_or_rebuild(key, render, ttl=60)`.",
    ),
    EntryPoint(
        "async-get",
        "stampede.asyncio `get_or_rebuild`, N tasks",
        ("redis",),
        "`stampede.asyncio.Stampede(redis.asyncio.Redis.from_url(url))` on a loop of its own; each task: "
        "`await get_or_rebuild(key, render, ttl=60)` with a coroutine render.",
    ),
    EntryPoint(
        "async-read",
        "stampede.asyncio `read` + `commit`, N tasks",
        ("redis",),
        "The same asyncio `Stampede`; each task: `await read(key, ttl=60)`, and on a miss `await` the "
        "render, then `await commit(lease, value)` if it got the lease.",
    ),
    EntryPoint(
        "django-page",
        "Django `cache_page`, sync view, waitress: `django_stampede.StampedeCache`",
        _DJANGO,
        "`@cache_page(60)` on a sync view; `CACHES` with `BACKEND: django_stampede.StampedeCache`, "
        "`LOCATION` the server's URL, `TIMEOUT: 60`, `OPTIONS: {'NAMESPACE': ...}`; waitress with N "
        "threads.",
        app="django",
        server="waitress",
    ),
    EntryPoint(
        "django-page-stock",
        "Django `cache_page`, sync view, waitress: Django `RedisCache`",
        _DJANGO,
        "The same view and server on `django.core.cache.backends.redis.RedisCache` (`KEY_PREFIX` "
        "for the namespace, no other options).",
        app="django-stock",
        server="waitress",
    ),
    EntryPoint(
        "django-aget-or-set",
        "Django `aget_or_set`, async view, uvicorn: `StampedeCache`",
        ("django", "uvicorn"),
        "An async view returning `await cache.aget_or_set(key, coroutine_function, 60)`; "
        "`StampedeCache` as above; Django's ASGI handler under uvicorn.",
        app="django",
        server="uvicorn",
        path="/aget-or-set",
    ),
    EntryPoint(
        "django-apage",
        "Django `cache_page`, async view, uvicorn: `StampedeCache`",
        ("django", "uvicorn"),
        "`@cache_page(60)` on an async view (Django runs the cache middleware's sync `get` and `set` "
        "on the event loop itself); `StampedeCache` as above; uvicorn.",
        app="django",
        server="uvicorn",
        path="/apage",
    ),
    EntryPoint(
        "django-apage-awaited",
        "`django_stampede.cache_page`, async view, uvicorn: `StampedeCache`",
        ("django", "uvicorn"),
        "`@django_stampede.cache_page(60)` (Django's signature; its async branch awaits `aget` and "
        "`aset`) on the same async view; `StampedeCache` as above; uvicorn.",
        app="django",
        server="uvicorn",
        path="/apage-awaited",
    ),
    EntryPoint(
        "flask-caching",
        "Flask-Caching `@cache.cached`, waitress: `flask_stampede.StampedeCache`",
        _FLASK,
        "`@cache.cached(timeout=60)` on a sync view; `CACHE_TYPE: flask_stampede.StampedeCache`, "
        "`CACHE_REDIS_URL`, `CACHE_KEY_PREFIX`, `CACHE_DEFAULT_TIMEOUT: 60`; waitress with N threads.",
        app="flask-caching",
        server="waitress",
    ),
    EntryPoint(
        "flask-caching-stock",
        "Flask-Caching `@cache.cached`, waitress: its `RedisCache`",
        _FLASK,
        "The same view and server with `CACHE_TYPE: RedisCache`.",
        app="flask-caching-stock",
        server="waitress",
    ),
    EntryPoint(
        "flask-stampede",
        "flask_stampede `@stampede.cached`, waitress",
        ("flask", "waitress"),
        "`stampede = flask_stampede.Stampede(app)` with `STAMPEDE_REDIS_URL` and `STAMPEDE_NAMESPACE`; "
        "`@stampede.cached(ttl=60)` on a sync view; waitress with N threads.",
        app="flask-stampede",
        server="waitress",
    ),
)


def entry(name: str) -> EntryPoint:
    for point in ENTRY_POINTS:
        if point.name == name:
            return point
    raise KeyError(f"no entry point named {name!r}")


@dataclass(frozen=True)
class Cell:
    """One entry point at one N: what its callers saw, what the servers counted."""

    n: int
    rebuilds: int = 0
    outcomes: Sequence[Outcome] = ()
    peak: int = 0
    #: The exceptions in the app server's log, counted (web entry points only).
    server_errors: collections.Counter[str] = field(default_factory=collections.Counter)
    #: Why the cell could not be measured at all, if it could not.
    failure: str | None = None

    @property
    def errors(self) -> collections.Counter[str]:
        return collections.Counter(o.error for o in self.outcomes if o.error is not None)

    @property
    def slowest(self) -> float:
        return max((o.latency for o in self.outcomes), default=float("nan"))

    def shown(self) -> str:
        if self.failure is not None:
            return "failed"
        errors = sum(self.errors.values())
        return f"{self.rebuilds} / {errors} / {self.peak} / {millis(self.slowest)}"


Log = Callable[[str], None]


def callers(text: str) -> int:
    """``--n``'s value: a number of callers, at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"N must be at least 1, got {value}")
    return value


def run(
    run_id: str,
    *,
    counts: Sequence[int] = COUNTS,
    names: Sequence[str] | None = None,
    redis_url: str | None = None,
    log: Log,
) -> tuple[Section, str]:
    """Run every cell of the entry points ``names`` (default: all whose modules are installed);
    the section, and the version of the redis-server used."""
    _raise_file_limit()
    counts = list(dict.fromkeys(counts))  # one column per N, in the order given
    asked = [point for point in ENTRY_POINTS if names is None or point.name in names]
    points = [point for point in asked if not point.missing()]
    skipped = [
        f"Skipped {point.label}: {', '.join(point.missing())} not installed "
        "(the `dev` and `bench` extras install them; uvicorn is only in `test`)."
        for point in asked
        if point.missing()
    ]
    for note in skipped:
        log(note)
    version = _redis_version(redis_url)
    results: dict[str, list[Cell]] = {}
    for point in points:
        for n in counts:
            log(f"many {point.name}, N={n}: running")
            cell = _cell(
                point, n, namespace=f"{key_prefix(run_id)}many:{point.name}:{n}", redis_url=redis_url, log=log
            )
            if cell.failure is None:
                log(
                    f"many {point.name}, N={n}: {cell.rebuilds} rebuild(s), {sum(cell.errors.values())} "
                    f"error(s), peak {cell.peak} connection(s), slowest {millis(cell.slowest)}"
                )
            results.setdefault(point.name, []).append(cell)
    return section(results, counts, shared=redis_url is not None, skipped=skipped), version


def _cell(point: EntryPoint, n: int, *, namespace: str, redis_url: str | None, log: Log) -> Cell:
    """Measure ``point`` with ``n`` callers; a :class:`Cell` with ``failure`` (and the whole story
    in the log) if that was not possible."""
    try:
        with contextlib.ExitStack() as stack:
            if redis_url is None:
                url = stack.enter_context(RedisServer()).url
            else:
                url = redis_url
                stack.callback(_delete_keys, url, namespace)
            renders = RenderLog(str(Path(stack.enter_context(tempfile.TemporaryDirectory())) / "renders"))
            if not point.app:
                with ConnectionPeak(url) as peak:
                    outcomes = RUNNERS[point.name](url, namespace, n, renders, TIMEOUT)
                return Cell(n, renders.count(), outcomes, peak.peak)
            server = stack.enter_context(_app_server(point, n, url, namespace, renders))
            with ConnectionPeak(url) as peak:
                outcomes = in_threads(
                    n, connector(server.port, TIMEOUT), getter(point.path, TIMEOUT), timeout=TIMEOUT
                )
            rebuilds = renders.count()
            return Cell(n, rebuilds, outcomes, peak.peak, server_errors=server.errors())
    except Exception as exc:
        log(f"many {point.name}, N={n}: could not run: {type(exc).__name__}: {exc}")
        first_line = next(iter(str(exc).splitlines()), "").rstrip(":")
        return Cell(n, failure=f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__)


def _app_server(point: EntryPoint, n: int, url: str, namespace: str, renders: RenderLog) -> AppServer:
    """The app server of ``point``'s cell: waitress with a thread per caller, or uvicorn."""
    server = SERVERS[point.server]
    return app_server(
        f"many:{server.interface}",
        server if server.threads is None else server.with_threads(n),
        env={**many.environment(point.app, url, namespace), RENDERS_ENV: renders.path},
        name=f"{point.app} ({server.described})",
    )


def _redis_version(redis_url: str | None) -> str:
    with contextlib.ExitStack() as stack:
        url = redis_url or stack.enter_context(RedisServer()).url
        client = redis.Redis.from_url(url, socket_timeout=5.0)
        try:
            return str(client.info("server")["redis_version"])
        finally:
            client.close()


def _delete_keys(url: str, namespace: str) -> None:
    """On a Redis that is not a throwaway one, remove what the cell wrote."""
    client = redis.Redis.from_url(url, socket_timeout=10.0)
    try:
        delete_matching(client, f"*{namespace}*")
    except redis.RedisError:
        pass
    finally:
        client.close()


def _raise_file_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = FILE_LIMIT if hard == resource.RLIM_INFINITY else min(FILE_LIMIT, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


# --- the section -------------------------------------------------------------


def section(
    results: dict[str, list[Cell]], counts: Sequence[int], *, shared: bool, skipped: Sequence[str]
) -> Section:
    rows = [[entry(name).label, *(cell.shown() for cell in cells)] for name, cells in results.items()]
    notes = [
        "Expected of stampede in every cell: 1 rebuild and 0 errors. redis-py's `ConnectionPool` holds at "
        "most 100 connections by default and raises `MaxConnectionsError` at once when they are all in "
        "use.",
        *(_findings(entry(name), cells) for name, cells in results.items()),
        *(f"{entry(name).label}: {entry(name).config}" for name in results),
        *skipped,
    ]
    servers = (
        "all cells against the one Redis given (the connection counts include its other clients)"
        if shared
        else "each cell against a fresh redis-server"
    )
    return Section(
        title="4. Many waiters: one cold key, N concurrent callers in one process",
        intro=(
            "N callers of one process (threads, asyncio tasks, or HTTP requests to one server process) "
            "ask for the same missing key at the same instant; the render they wait for sleeps "
            f"{millis(RENDER_SECONDS)}. Each cell: **rebuilds** (renders that began) / **errors** "
            f"(exceptions, HTTP status other than 200, or no answer within {TIMEOUT:g} s) / **peak** "
            "Redis client connections (`INFO clients` every 10 ms, less the count before the release) / "
            "the **slowest** caller, from its call to its answer or error. "
            f"{servers[0].upper()}{servers[1:]}; the web apps run in a server process of their own "
            "(waitress with N threads, or uvicorn), started for the cell and stopped after it."
        ),
        table=Table(
            headers=[
                "entry point (each cell: rebuilds / errors / peak conns / slowest)",
                *(f"N={n}" for n in counts),
            ],
            rows=rows,
            align="l" + "r" * len(counts),
        ),
        notes=[note for note in notes if note],
    )


def _findings(point: EntryPoint, cells: Sequence[Cell]) -> str:
    """What went wrong in ``point``'s cells, if anything: the commonest errors of each."""
    parts = []
    for cell in cells:
        if cell.failure is not None:
            parts.append(f"N={cell.n}: could not run ({cell.failure})")
            continue
        said = []
        if cell.rebuilds != 1:
            said.append(f"{cell.rebuilds} rebuilds")
        if cell.errors:
            said.append(_counted(cell.errors))
        if cell.server_errors:
            said.append(f"in the server's log: {_counted(cell.server_errors)}")
        if said:
            parts.append(f"N={cell.n}: {'; '.join(said)}")
    return f"{point.label}: {'. '.join(parts)}." if parts else ""


def _counted(counter: collections.Counter[str], most: int = 3) -> str:
    shown = [f"{count} x `{_clipped(what)}`" for what, count in counter.most_common(most)]
    rest = sum(counter.values()) - sum(count for _, count in counter.most_common(most))
    return ", ".join(shown) + (f" and {rest} more" if rest else "")


def _clipped(text: str, limit: int = 160) -> str:
    text = text.replace("`", "'")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench manywaiters",
        description="N callers of one process on one cold key, through each of stampede's entry points.",
    )
    parser.add_argument(
        "--n",
        type=callers,
        action="append",
        metavar="N",
        help="run each entry point with N concurrent callers (repeatable; default: "
        f"{', '.join(map(str, COUNTS))}); a small N makes a quick check",
    )
    parser.add_argument(
        "--entry",
        action="append",
        choices=[point.name for point in ENTRY_POINTS],
        help="run only this entry point (repeatable; default: all that are installed)",
    )
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL") or None,
        help="run every cell on this one Redis instead of a fresh redis-server each (default: $REDIS_URL)",
    )
    args = parser.parse_args(argv)
    section, version = run(
        secrets.token_hex(4),
        counts=args.n or COUNTS,
        names=args.entry,
        redis_url=args.redis_url,
        log=progress,
    )
    print(environment_line(version, quick=False), end="\n\n")
    print(render_section(section))
    return 0
