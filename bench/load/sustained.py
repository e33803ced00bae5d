"""Scenario: load that lasts. 150 clients ask for one cached page again and again for 15 s; the page
is fresh for 3 s and its render takes 1 s, so a single-flight cache renders it once per window:
the cold start, then once per expiry. Each row is one page served by one server the way people
deploy it, on stock Django (or Flask-Caching) and on stampede side by side, each on a fresh
redis-server and a fresh server process.

Per run: the renders (and how many began in a window already rendered: before
the page the previous render stored had gone stale), the requests that did not
get a 200, the slowest 1% and the slowest answer, and the most Redis
connections one server process held at once.

``python -m bench sustained [--row NAME] [--quick]`` prints the section alone;
``python -m bench herd`` runs it too.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from stampede.testing import RedisServer
from support.app_servers import SERVERS, AppServerError

from .._common import servers
from .._common.report import Section, Table, environment_line, progress, render_section
from . import _sustained
from ._apps.sustained_config import Backend

__all__ = ["ROWS", "Row", "main", "run"]

CLIENTS = 150
SECONDS = 15.0
TTL = 3
RENDER_SECONDS = 1.0
#: ``--quick``: seconds of each run, the cold start and one expiry.
QUICK_SECONDS = 5.0

Log = Callable[[str], None]


@dataclass(frozen=True)
class Row:
    """One page under one server."""

    server: str
    framework: Literal["django", "flask"]
    path: str
    view: str

    @property
    def name(self) -> str:
        return f"{self.framework}:{self.server}:{self.path.strip('/')}"


_DJANGO_SYNC = "sync view, Django's `cache_page`"
_DJANGO_ASYNC = "async view, `django_stampede.cache_page` (stock: Django's)"
_DJANGO_ASIDE = "async view, `aget` / render / `aset`"
_FLASK_CACHED = "`@stampede.cached` (stock: Flask-Caching `RedisCache`)"
_FLASK_CACHING = "Flask-Caching `@cache.cached` on `flask_stampede.StampedeCache`"
_FLASK_ASYNC = "async view, `@stampede.cached` (stock: `cache.get`/`set`)"

ROWS: tuple[Row, ...] = (
    Row("gunicorn-sync", "django", "/page", _DJANGO_SYNC),
    Row("gunicorn-gthread", "django", "/page", _DJANGO_SYNC),
    Row("gunicorn-gevent", "django", "/page", _DJANGO_SYNC),
    Row("uvicorn", "django", "/apage", _DJANGO_ASYNC),
    Row("uvicorn-2", "django", "/apage", _DJANGO_ASYNC),
    Row("uvicorn-2", "django", "/aaside", _DJANGO_ASIDE),
    Row("uvicorn-2", "django", "/page", _DJANGO_SYNC),
    Row("gunicorn-uvicorn", "django", "/apage", _DJANGO_ASYNC),
    Row("hypercorn", "django", "/apage", _DJANGO_ASYNC),
    Row("daphne", "django", "/apage", _DJANGO_ASYNC),
    Row("gunicorn-gthread", "flask", "/page", _FLASK_CACHED),
    Row("gunicorn-gevent", "flask", "/page", _FLASK_CACHED),
    Row("gunicorn-gevent", "flask", "/fc-page", _FLASK_CACHING),
    Row("uvicorn", "flask", "/apage", _FLASK_ASYNC),
)


def _one(row: Row, backend: Backend, *, clients: int, seconds: float, log: Log) -> _sustained.Outcome | str:
    with RedisServer() as redis:
        try:
            return _sustained.run(
                SERVERS[row.server],
                row.framework,
                row.path,
                backend=backend,
                redis_url=redis.url,
                namespace=f"sustained-{backend}",
                clients=clients,
                seconds=seconds,
                ttl=TTL,
                render_seconds=RENDER_SECONDS,
            )
        except AppServerError as exc:
            log(f"sustained {row.name} ({backend}): {exc}")
            return f"failed: {str(exc).splitlines()[0]}"


def run(
    *, names: Sequence[str] | None = None, clients: int = CLIENTS, seconds: float = SECONDS, log: Log
) -> Section:
    """Run every row (or those named), stock then stampede; the section."""
    rows = [row for row in ROWS if names is None or row.name in names]
    skipped = sorted(
        {
            f"Skipped {SERVERS[row.server].described}: {', '.join(missing)} not installed "
            "(the `test` extra installs them)."
            for row in rows
            if (missing := SERVERS[row.server].missing())
        }
    )
    cells: list[list[str]] = []
    for row in rows:
        if SERVERS[row.server].missing():
            continue
        outcomes: dict[Backend, _sustained.Outcome | str] = {}
        for backend in ("stock", "stampede"):
            log(f"sustained {row.name} ({backend}): running")
            outcome = _one(row, backend, clients=clients, seconds=seconds, log=log)
            if isinstance(outcome, _sustained.Outcome):
                log(f"sustained {row.name}: {outcome.describe()}")
            outcomes[backend] = outcome
        cells.append(_cells(row, outcomes["stock"], outcomes["stampede"]))
    windows = 1 + int(seconds // (TTL + RENDER_SECONDS))
    return Section(
        title="Load that lasts: one page through the servers people deploy with",
        intro=(
            f"{clients} clients (threads, keep-alive) ask for one page again and again for {seconds:g} s; "
            f"the page is fresh for {TTL} s (`TIMEOUT`; stampede serves it stale for 60 s more) and its "
            f"render takes {RENDER_SECONDS:g} s, so a single-flight cache renders it at most {windows} "
            "times: the cold start, then once per expiry. Renders counted across every server "
            "process (in brackets: renders that began in a window already rendered); errors: answers "
            "other than 200 (HTTP 500s from an emptied connection pool, say); connections: the most "
            "Redis connections one server process held at once. The app also misses a key in its "
            "main thread at start-up, as sites that read a flag in `AppConfig.ready` do. Each run on "
            "a fresh redis-server and a fresh server; `python -m bench sustained`."
        ),
        table=Table(
            headers=[
                "server",
                "page",
                "stock: renders",
                "stampede: renders",
                "stock: errors",
                "stampede: errors",
                "stampede: slowest 1% / slowest",
                "stock / stampede: connections",
            ],
            rows=cells,
            align="llrrrrrr",
        ),
        notes=skipped,
    )


def _cells(row: Row, stock: _sustained.Outcome | str, ours: _sustained.Outcome | str) -> list[str]:
    def renders(outcome: _sustained.Outcome | str) -> str:
        if isinstance(outcome, str):
            return outcome
        return f"{outcome.begun} ({len(outcome.overlaps)})"

    def errors(outcome: _sustained.Outcome | str) -> str:
        return "" if isinstance(outcome, str) else f"{outcome.load.failed} of {outcome.load.requests}"

    def slowest(outcome: _sustained.Outcome | str) -> str:
        if isinstance(outcome, str) or not outcome.load.latencies:
            return ""
        worst = max(outcome.load.latencies)
        return f"{_ms(outcome.load.slowest(99))} / {_ms(worst)}"

    def connections(outcome: _sustained.Outcome | str) -> str:
        return "?" if isinstance(outcome, str) else str(outcome.peak_connections)

    label = f"{row.framework.capitalize()}, {SERVERS[row.server].described}"
    return [
        label,
        row.view,
        renders(stock),
        renders(ours),
        errors(stock),
        errors(ours),
        slowest(ours),
        f"{connections(stock)} / {connections(ours)}",
    ]


def _ms(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds * 1000:.0f} ms"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench sustained",
        description="Load that lasts: one cached page under each app server, stock caches beside stampede.",
    )
    parser.add_argument(
        "--row",
        action="append",
        choices=[row.name for row in ROWS],
        help="run only this page under this server (repeatable; default: all whose server is installed)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"each run {QUICK_SECONDS:g} s instead of {SECONDS:g} (the cold start and one expiry)",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    section = run(names=args.row, seconds=QUICK_SECONDS if args.quick else SECONDS, log=progress)
    print(environment_line(servers.default_version(), quick=args.quick), end="\n\n")
    print(render_section(section))
    progress(f"sustained: {time.monotonic() - started:.0f} s")
    return 0
