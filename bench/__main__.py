"""``python -m bench``: run the scenarios side by side and print Markdown tables.

Uses the Redis at ``--redis-url`` (or ``$REDIS_URL``) if given, else starts a
throwaway redis-server (:class:`stampede.testing.RedisServer`) and always
stops it, on errors and Ctrl-C too. The tables also go to
``bench/results/latest.md``; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import NoReturn

import redis

import stampede
from stampede.testing import RedisServer

from . import cold, hitpath, hot
from ._load import WorkerError
from ._workload import NAMESPACE, key_prefix
from .report import Section, environment_line, render_document

PROCESSES = 4
THREADS = 16
SCENARIOS = ("hit", "cold", "hot")
RESULTS = Path(__file__).resolve().parent / "results" / "latest.md"


@dataclass(frozen=True)
class Settings:
    hit_rounds: int
    hit_calls: int
    cold_trials: int
    hot_duration: float
    hot_think: float


FULL = Settings(hit_rounds=7, hit_calls=5000, cold_trials=3, hot_duration=8.0, hot_think=0.01)
QUICK = Settings(hit_rounds=3, hit_calls=1000, cold_trials=1, hot_duration=3.0, hot_think=0.01)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="stampede against naive cache-aside on a real Redis, side by side.",
    )
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL") or None,
        help="use this Redis instead of starting a redis-server (default: $REDIS_URL)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer rounds and shorter runs (~30 s)")
    parser.add_argument(
        "--scenario",
        action="append",
        choices=SCENARIOS,
        help="run only this scenario (repeatable; default: all)",
    )
    return parser.parse_args(argv)


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def _interrupt(signum: int, frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt  # SIGTERM takes the same way out as Ctrl-C


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = QUICK if args.quick else FULL
    chosen = [name for name in SCENARIOS if name in (args.scenario or SCENARIOS)]
    signal.signal(signal.SIGTERM, _interrupt)
    started = time.monotonic()
    try:
        with contextlib.ExitStack() as stack:
            url = args.redis_url
            if url is None:
                server = RedisServer()
                stack.callback(server.close)
                url = server.start().url
                log(f"started redis-server on {url}")
            document = run(url, chosen, settings, quick=args.quick, started=started)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    except (WorkerError, stampede.StampedeError, redis.RedisError) as exc:
        log(f"failed: {exc}")
        return 1
    print(document, end="")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(document, encoding="utf-8")
    log(f"wrote {RESULTS} ({time.monotonic() - started:.0f} s in all)")
    return 0


def run(url: str, chosen: Sequence[str], settings: Settings, *, quick: bool, started: float) -> str:
    """Run the ``chosen`` scenarios against ``url``; the Markdown document."""
    run_id = secrets.token_hex(4)
    client = redis.Redis.from_url(url, socket_timeout=10.0)
    try:
        version = str(client.info("server")["redis_version"])
        sections: list[Section] = []
        for name in chosen:
            log(f"{name}: running ({time.monotonic() - started:.0f} s so far)")
            sections.append(_scenario(name, url, run_id, settings))
    finally:
        with contextlib.suppress(redis.RedisError):
            _delete_keys(client, run_id)
        client.close()
    footer = f"_{len(sections)} scenario(s) in {time.monotonic() - started:.0f} s; `python -m bench`._"
    return render_document(environment_line(version, quick=quick), sections, footer)


def _scenario(name: str, url: str, run_id: str, settings: Settings) -> Section:
    if name == "hit":
        return hitpath.run(url, run_id=run_id, rounds=settings.hit_rounds, calls=settings.hit_calls)
    if name == "cold":
        return cold.run(url, run_id=run_id, trials=settings.cold_trials, processes=PROCESSES, threads=THREADS)
    return hot.run(
        url,
        run_id=run_id,
        duration=settings.hot_duration,
        think=settings.hot_think,
        processes=PROCESSES,
        threads=THREADS,
    )


def _delete_keys(client: redis.Redis, run_id: str) -> None:
    """Remove what this run wrote, in case the Redis is not a throwaway one."""
    prefix = key_prefix(run_id)
    for pattern in (f"{prefix}*", f"{NAMESPACE}:{{{prefix}*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.unlink(*keys)


if __name__ == "__main__":
    sys.exit(main())
