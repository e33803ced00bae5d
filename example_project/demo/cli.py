"""The demo: ``python -m example_project.demo`` from the root of a checkout
(``make demo`` runs it so).

Starts a redis-server unless ``--redis-url`` (or ``$REDIS_URL``) is given,
serves each example app with waitress in a few processes, and sends many
concurrent clients at its expensive pages while they expire: first on the
framework's stock Redis cache, then on stampede. Prints a table per app and
draws a PNG over time: requests, latency, runs of the expensive code, and the
Redis commands and connections sampled meanwhile. Everything it starts is
stopped, on errors and on SIGINT (Ctrl-C), SIGTERM and SIGHUP too: it installs
its own handlers for those, whatever it inherited (a background job of a
script starts with SIGINT ignored, ``nohup`` with SIGHUP).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import platform
import secrets
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

import redis

import stampede
from example_project.expensive import runs_key
from support.app_servers import AppServerError

from .load import ClientCrowd, Target
from .report import Run, Summary, render_tables, summarise
from .sampler import sampled
from .servers import STOP_SIGNALS, app_servers, deferred_signals

if TYPE_CHECKING:
    from stampede.testing import RedisServer

__all__ = ["main"]


@dataclasses.dataclass
class Started:
    """The processes the demo started, for the JSON (and the tests) to check."""

    redis: int | None = None
    servers: list[int] = dataclasses.field(default_factory=list)


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
#: The command, in usage and error messages.
PROG = "python -m example_project.demo"


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be more than 0 and finite, got {text!r}")
        return value

    return parse


def _redis_url(text: str) -> str:
    if not text.startswith(("redis://", "rediss://", "unix://")):
        raise argparse.ArgumentTypeError(f"must start with redis://, rediss:// or unix://, got {text!r}")
    return text


def _writable(option: str, path: Path) -> None:
    """Refuse an output path whose directory cannot be written, before the run rather than after."""
    directory = path.resolve().parent
    existing = next((p for p in (directory, *directory.parents) if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK):
        raise SystemExit(f"{PROG}: {option} {path}: cannot write into {directory}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
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
        type=_redis_url,
        default=os.environ.get("REDIS_URL") or None,
        help="use this Redis instead of starting a redis-server (default: $REDIS_URL)",
    )
    parser.add_argument(
        "--output", type=Path, default=Path("stampede-demo.png"), help="the PNG (stampede-demo.png)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    _writable("--output", args.output)
    if args.json is not None:
        _writable("--json", args.json)
    return args


def log(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


def _interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt  # SIGTERM and SIGHUP take the same way out as Ctrl-C


@contextlib.contextmanager
def _stop_signals_handled() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt while the demo runs, whatever
    it inherited; the previous handlers are put back after.

    Python installs its Ctrl-C handler only when SIGINT is not ignored at start, and
    a background job of a script starts with SIGINT ignored (``nohup``: SIGHUP):
    left so, the signal would be lost and the demo would run on. A handled
    signal is also reset to the default in the processes the demo starts (an
    ignored one would be inherited), so its servers die of them as usual.
    """
    previous = {sig: signal.signal(sig, _interrupt) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _missing_modules() -> list[str]:
    return [name for name in REQUIRED if importlib.util.find_spec(name) is None]


def main(argv: Sequence[str] | None = None) -> int:
    with _stop_signals_handled():
        try:
            return _main(argv)
        except KeyboardInterrupt:
            log("interrupted; everything the demo started is stopped")
            return 130


def _main(argv: Sequence[str] | None) -> int:
    args = parse_args(argv)
    missing = _missing_modules()
    if missing:
        log(f"missing {', '.join(missing)}: in a checkout, pip install -e . --group demo (or make demo)")
        return 2
    apps = [app for app in PAGES if app in (args.app or PAGES)]
    processes = Started()
    try:
        with contextlib.ExitStack() as stack:
            url = args.redis_url
            if url is None:
                from stampede.testing import RedisServer

                server = RedisServer()
                stack.callback(_close_shielded, server)
                # Deferred (a few milliseconds): interrupted between its start and its
                # noting, the redis-server would be left behind.
                with deferred_signals():
                    url = server.start().url
                processes.redis = server.pid
                log(f"started a redis-server for the demo at {url} (pid {server.pid})")
            runs = _run_all(url, apps, args, processes)
    except AppServerError as exc:
        log(f"failed: {exc}")
        return 1
    except redis.RedisError as exc:
        where = f"--redis-url {args.redis_url}" if args.redis_url else "the demo's redis-server"
        log(f"failed: Redis error with {where}: {exc}")
        return 1
    except (stampede.StampedeError, RuntimeError, OSError) as exc:
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
        print(_redis_verdict(app, runs))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        document = {
            "settings": _settings(args),
            "processes": dataclasses.asdict(processes),
            "summaries": [s.as_dict() for s in summaries],
            "redis": [run.redis_figures() for run in runs],
        }
        args.json.write_text(json.dumps(_no_nan(document), indent=2), encoding="utf-8")
        log(f"figures written to {args.json}")
    try:
        _write_plot(runs, args)
    except OSError as exc:
        log(f"could not write the plot to {args.output}: {exc}")
        return 1
    return 0


def _close_shielded(server: RedisServer) -> None:
    with deferred_signals():
        server.close()


def _no_nan(value: object) -> object:
    """NaN (no successful request to take a percentile of) is not JSON: null instead."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_nan(v) for v in value]
    return value


def _settings(args: argparse.Namespace) -> dict[str, object]:
    return {
        "clients": args.clients,
        "duration": args.duration,
        "rebuild_time": args.rebuild_time,
        "ttl": args.ttl,
        "think": args.think,
        "processes": args.processes,
    }


def _run_all(url: str, apps: Sequence[str], args: argparse.Namespace, processes: Started) -> list[Run]:
    from tqdm import tqdm

    run_id = secrets.token_hex(3)
    client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
    client.ping()  # before any server starts: a wrong URL fails at once, by name
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
                    run = _run(client, url, app, cache, prefix, args, bar, processes)
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
    bar: Any,
    processes: Started,
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
    # Connected before the servers start, so that its baseline of connections is not theirs.
    with sampled(url, runs_key(prefix)) as sampler, app_servers(app, args.processes, threads, env) as servers:
        ports = [server.port for server in servers]
        pids = [server.pid for server in servers if server.pid is not None]
        processes.servers.extend(pids)
        _note(f"{app} on {cache}: serving on ports {ports} (pids {pids})")
        targets = [Target(port, path, page) for page, path, _ in PAGES[app] for port in ports]
        # Every request is bounded, and outlasts the longest wait for a rebuild.
        load = ClientCrowd(targets, args.clients, args.think, timeout=max(30.0, 3 * args.rebuild_time + 10))
        try:
            # Not interrupted halfway: every thread started is one that stop() can join.
            with deferred_signals():
                sampler.start()
                load.start()
            shown = 0
            while (elapsed := time.time() - load.started) < args.duration:
                time.sleep(min(0.25, args.duration - elapsed))
                for server in servers:
                    server.check()  # a dead server would make the comparison meaningless
                step = min(int(time.time() - load.started), round(args.duration)) - shown
                if step > 0:
                    bar.update(step)
                    shown += step
                bar.set_postfix_str(f"{load.count():,} requests, {sampler.expensive_runs} expensive runs")
        finally:
            requests = load.stop()  # on the way out too: no client thread goes on knocking
        samples = sampler.stop(origin=load.started)
        bar.update(round(args.duration) - shown)
    expensive = []
    for entry in client.lrange(runs_key(prefix), 0, -1):
        text = entry.decode() if isinstance(entry, bytes) else entry
        label, _, at = text.rpartition(" ")
        expensive.append((label.partition(":")[2], float(at) - load.started))
    return Run(
        app,
        cache,
        args.duration,
        args.ttl,
        args.rebuild_time,
        requests,
        expensive,
        redis_samples=samples,
        baseline_clients=sampler.baseline_clients,
    )


def _note(message: str) -> None:
    """A log line that does not tear the progress bar."""
    from tqdm import tqdm

    tqdm.write(f"[demo] {message}", file=sys.stderr)


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
    if stock.errors or ours.errors:
        return f"{app}: requests failed ({stock.errors} stock, {ours.errors} stampede): no verdict."
    return (
        f"{app}: the expensive code ran {ours.expensive_runs} times on stampede against "
        f"{stock.expensive_runs} on {STOCK[app]}; {ours.slow:,} requests waited for it against "
        f"{stock.slow:,}; p99 {ours.p99_ms:,.0f} ms against {stock.p99_ms:,.0f} ms."
    )


def _redis_verdict(app: str, runs: Sequence[Run]) -> str:
    figures = {run.cache: run.redis_figures() for run in runs if run.app == app}
    stock, ours = figures.get("stock"), figures.get("stampede")
    if stock is None or ours is None:
        return ""

    def per_request(figures: dict[str, object]) -> str:
        value = figures["commands_per_request"]
        return "n/a" if value is None else f"{value:.2f}"

    return (
        f"{app} in Redis: {ours['commands']:,} commands on stampede ({per_request(ours)} per request) "
        f"against {stock['commands']:,} on {STOCK[app]} ({per_request(stock)} per request); "
        f"at most {ours['max_clients']} connections against {stock['max_clients']}."
    )


def _write_plot(runs: Sequence[Run], args: argparse.Namespace) -> None:
    if importlib.util.find_spec("matplotlib") is None:
        log("no plot: matplotlib is not installed (in a checkout: pip install -e . --group demo)")
        return
    from .plot import plot

    title = (
        f"stampede demo: {args.clients} clients, pages fresh for {args.ttl} s, expensive code "
        f"{args.rebuild_time:g} s, {args.processes} server processes per app — "
        f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    plot(runs, args.output, title)
    print(f"\nplot: {args.output.resolve()}")
