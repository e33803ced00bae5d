"""``stampede demo`` (also ``python -m stampede demo`` and ``make demo``).

Starts a redis-server unless ``--redis-url`` (or ``$REDIS_URL``) is given,
serves each example app with waitress in a few processes, and sends many
concurrent clients at its expensive pages while they expire: first on the
framework's stock Redis cache, then on stampede. Prints a table per app and
draws a PNG over time. Everything it starts is stopped, on errors and Ctrl-C too.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import secrets
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import NoReturn

import redis

from example_project.expensive import runs_key

from .load import Stampede, Target
from .report import Run, Summary, render_tables, summarise
from .servers import ServerError, app_servers

__all__ = ["main"]

#: Each app's expensive pages: name, URL path, and how the page is cached.
PAGES = {
    "django": (
        ("report", "/report/", "cache_page on the view"),
        ("dashboard", "/dashboard/", "{% cache %} around the slow fragment"),
    ),
    "flask": (
        ("report", "/report", "@stampede.cached (stock: Flask-Caching's @cache.cached)"),
        ("dashboard", "/dashboard", "Flask-Caching's @cache.cached (on stampede's backend)"),
    ),
}
STOCK = {"django": "Django's RedisCache", "flask": "Flask-Caching's RedisCache"}
CACHES = ("stock", "stampede")
REQUIRED = ("django", "flask", "flask_caching", "waitress", "tqdm")


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, got {text!r}")
        return value

    return parse


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="stampede demo",
        description="Put the example Django site and Flask app under a cache stampede, "
        "first on their stock Redis cache, then on stampede.",
    )
    parser.add_argument("--clients", type=_positive(int), default=32, help="concurrent clients (32)")
    parser.add_argument(
        "--duration", type=_positive(float), default=20.0, help="seconds each app runs on each cache (20)"
    )
    parser.add_argument(
        "--rebuild-time",
        type=_positive(float),
        default=1.0,
        help="seconds the expensive code takes (1.0)",
    )
    parser.add_argument("--ttl", type=_positive(int), default=5, help="seconds a cached page is fresh (5)")
    parser.add_argument(
        "--think", type=_positive(float), default=0.1, help="seconds a client pauses between requests (0.1)"
    )
    parser.add_argument("--processes", type=_positive(int), default=2, help="server processes per app (2)")
    parser.add_argument(
        "--app",
        action="append",
        choices=tuple(PAGES),
        help="run only this app (repeatable; default: both)",
    )
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL") or None,
        help="use this Redis instead of starting a redis-server (default: $REDIS_URL)",
    )
    parser.add_argument(
        "--output", type=Path, default=Path("stampede-demo.png"), help="the PNG (stampede-demo.png)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    return parser.parse_args(argv)


def log(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


def _interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt  # SIGTERM takes the same way out as Ctrl-C


def _missing_modules() -> list[str]:
    return [name for name in REQUIRED if importlib.util.find_spec(name) is None]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    missing = _missing_modules()
    if missing:
        log(f"missing {', '.join(missing)}: pip install 'stampede[demo]'")
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    apps = [app for app in PAGES if app in (args.app or PAGES)]
    try:
        with contextlib.ExitStack() as stack:
            url = args.redis_url
            if url is None:
                from stampede.testing import RedisServer

                server = RedisServer()
                stack.callback(server.close)
                url = server.start().url
                log(f"started a redis-server for the demo at {url}")
            runs = _run_all(url, apps, args)
    except KeyboardInterrupt:
        log("interrupted; everything the demo started is stopped")
        return 130
    except (ServerError, redis.RedisError) as exc:
        log(f"failed: {exc}")
        return 1
    summaries = [summary for run in runs for summary in summarise(run)]
    print()
    print(render_tables(summaries))
    for app in apps:
        print(_legend(app))
    print(
        "stale: served a page older than its TTL while one request re-rendered it; "
        "slow: took at least half the rebuild time, i.e. waited for the expensive code.\n"
    )
    for app in apps:
        print(_verdict(app, summaries))
    _write_plot(runs, args)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {"settings": _settings(args), "summaries": [s.as_dict() for s in summaries]}
        args.json.write_text(json.dumps(document, indent=2), encoding="utf-8")
        log(f"figures written to {args.json}")
    return 0


def _settings(args: argparse.Namespace) -> dict[str, object]:
    return {
        "clients": args.clients,
        "duration": args.duration,
        "rebuild_time": args.rebuild_time,
        "ttl": args.ttl,
        "think": args.think,
        "processes": args.processes,
    }


def _run_all(url: str, apps: Sequence[str], args: argparse.Namespace) -> list[Run]:
    from tqdm import tqdm

    run_id = secrets.token_hex(3)
    client = redis.Redis.from_url(url, socket_timeout=10)
    runs: list[Run] = []
    log(
        f"{args.clients} clients, {args.duration:g} s per app and cache, pages fresh for {args.ttl} s, "
        f"expensive code {args.rebuild_time:g} s, {args.processes} server processes per app"
    )
    try:
        with tqdm(
            total=round(len(apps) * len(CACHES) * args.duration),
            unit="s",
            bar_format="{desc} {bar} {n_fmt}/{total_fmt} s {postfix}",
            file=sys.stderr,
            dynamic_ncols=True,
            disable=not sys.stderr.isatty(),  # a log line per run instead, below
        ) as bar:
            for app in apps:
                for cache in CACHES:
                    prefix = f"demo-{run_id}-{app}-{cache}"
                    bar.set_description_str(f"{app:>6} · {cache:<8}")
                    run = _run(client, url, app, cache, prefix, args, bar)
                    runs.append(run)
                    if bar.disable:
                        log(
                            f"{app} on {cache}: {len(run.requests):,} requests, "
                            f"{len(run.expensive_runs)} runs of the expensive code"
                        )
    finally:
        with contextlib.suppress(redis.RedisError):
            _delete_keys(client, f"demo-{run_id}-")
        client.close()
    return runs


def _run(
    client: redis.Redis,
    url: str,
    app: str,
    cache: str,
    prefix: str,
    args: argparse.Namespace,
    bar: object,
) -> Run:
    """Serve ``app`` on ``cache`` and stampede it for ``args.duration`` seconds."""
    env = {
        "REDIS_URL": url,
        "EXAMPLE_CACHE": cache,
        "EXAMPLE_TTL": str(args.ttl),
        "EXAMPLE_REBUILD_SECONDS": str(args.rebuild_time),
        "EXAMPLE_KEY_PREFIX": prefix,
    }
    # A thread per client and a few spare: the server is not the bottleneck being shown.
    threads = -(-args.clients // args.processes) + 4
    with app_servers(app, args.processes, threads, env) as ports:
        targets = [Target(port, path, page) for page, path, _ in PAGES[app] for port in ports]
        load = Stampede(targets, args.clients, args.think)
        load.start()
        shown = 0
        while (elapsed := time.time() - load.started) < args.duration:
            time.sleep(min(0.25, args.duration - elapsed))
            step = min(int(time.time() - load.started), round(args.duration)) - shown
            if step > 0:
                bar.update(step)  # type: ignore[attr-defined]
                shown += step
            bar.set_postfix_str(  # type: ignore[attr-defined]
                f"{load.count():,} requests, {client.llen(runs_key(prefix))} expensive runs"
            )
        requests = load.stop()
        bar.update(round(args.duration) - shown)  # type: ignore[attr-defined]
    expensive = []
    for entry in client.lrange(runs_key(prefix), 0, -1):
        text = entry.decode() if isinstance(entry, bytes) else entry
        label, _, at = text.rpartition(" ")
        expensive.append((label.partition(":")[2], float(at) - load.started))
    return Run(app, cache, args.duration, args.ttl, args.rebuild_time, requests, expensive)


def _delete_keys(client: redis.Redis, prefix: str) -> None:
    """Remove what the demo wrote, in case the Redis is not a throwaway one."""
    keys = list(client.scan_iter(match=f"*{prefix}*", count=1000))
    for start in range(0, len(keys), 500):
        client.unlink(*keys[start : start + 500])


def _legend(app: str) -> str:
    pages = "; ".join(f"{page}: {how}" for page, _, how in PAGES[app])
    return f"{app} — stock: {STOCK[app]}. {pages}."


def _verdict(app: str, summaries: Sequence[Summary]) -> str:
    totals = {s.cache: s for s in summaries if s.app == app and s.page == "all"}
    stock, ours = totals.get("stock"), totals.get("stampede")
    if stock is None or ours is None:
        return ""
    return (
        f"{app}: the expensive code ran {ours.expensive_runs} times on stampede against "
        f"{stock.expensive_runs} on {STOCK[app]}; {ours.slow:,} requests waited for it against "
        f"{stock.slow:,}; p99 {ours.p99_ms:,.0f} ms against {stock.p99_ms:,.0f} ms."
    )


def _write_plot(runs: Sequence[Run], args: argparse.Namespace) -> None:
    if importlib.util.find_spec("matplotlib") is None:
        log("no plot: matplotlib is not installed (pip install 'stampede[demo]')")
        return
    from .plot import plot

    title = (
        f"stampede demo: {args.clients} clients, pages fresh for {args.ttl} s, expensive code "
        f"{args.rebuild_time:g} s, {args.processes} server processes per app — "
        f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    plot(runs, args.output, title)
    print(f"\nplot: {args.output.resolve()}")
