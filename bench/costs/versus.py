"""What a hit costs in two checkouts of stampede, side by side in one run.

``python -m bench versus OLD NEW [--rounds 8]``: ``OLD`` and ``NEW`` are
directories holding a checkout (``git worktree add /tmp/old HEAD~1``). Each
round runs this file once per checkout, in a child process whose
``PYTHONPATH`` puts that checkout first, alternating which goes first; the
child times ``get_or_rebuild`` hits of a small dict (blocking and asyncio,
without and with a near cache) against one redis-server, in CPU time of
the calling process (the round trip's wait is the server's, not ours). The
table shows each case's median over the rounds and ``new/old``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["main"]

#: Calls per timed block; each case keeps the best of three blocks.
CALLS = 5000
VALUE = {"id": 42, "name": "user", "tags": ["a", "b"]}


def _per_call(run: Callable[[], None], calls: int) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        for _ in range(calls):
            run()
        best = min(best, (time.process_time() - started) / calls * 1e6)
    return best


async def _aper_call(run: Callable[[], Any], calls: int) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        for _ in range(calls):
            await run()
        best = min(best, (time.process_time() - started) / calls * 1e6)
    return best


def _child(url: str) -> dict[str, float]:
    import redis
    import redis.asyncio

    import stampede
    import stampede.asyncio

    def value() -> dict[str, Any]:
        return VALUE

    timings: dict[str, float] = {}
    for name, near in (("blocking", None), ("blocking, near cache", 1000)):
        with stampede.Stampede(
            redis.Redis.from_url(url, socket_timeout=5), namespace=f"versus-{near}", near_cache=near
        ) as sf:
            sf.get_or_rebuild("k", value, ttl=3600)
            time.sleep(0.2)  # the near cache's tracking is live by then
            sf.get_or_rebuild("k", value, ttl=3600)
            calls = CALLS * 4 if near else CALLS
            timings[name] = _per_call(lambda sf=sf: sf.get_or_rebuild("k", value, ttl=3600), calls)  # type: ignore[misc]

    async def run_asyncio() -> None:
        async def avalue() -> Any:  # Any: mypy cannot pick T from Awaitable[T] | T
            return VALUE

        for name, near in (("asyncio", None), ("asyncio, near cache", 1000)):
            asf = stampede.asyncio.Stampede(
                redis.asyncio.Redis.from_url(url, socket_timeout=5),
                namespace=f"aversus-{near}",
                near_cache=near,
            )
            await asf.get_or_rebuild("k", avalue, ttl=3600)
            await asyncio.sleep(0.2)
            await asf.get_or_rebuild("k", avalue, ttl=3600)
            calls = CALLS * 4 if near else CALLS
            timings[name] = await _aper_call(lambda asf=asf: asf.get_or_rebuild("k", avalue, ttl=3600), calls)  # type: ignore[misc]
            await asf.aclose()
            await asf.client.aclose()

    asyncio.run(run_asyncio())
    return timings


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:  # one checkout's timings, run by the parent below
        print(json.dumps(_child(argv[1])))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench versus", description=__doc__.splitlines()[0])
    parser.add_argument("old", help="a checkout of stampede (the baseline)")
    parser.add_argument("new", help="another checkout")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args(argv)
    from stampede.testing import RedisServer

    results: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    checkouts = {"old": os.path.abspath(args.old), "new": os.path.abspath(args.new)}
    with RedisServer() as server:
        for round_ in range(args.rounds):
            order = ("old", "new") if round_ % 2 == 0 else ("new", "old")
            for which in order:
                root = checkouts[which]
                env = {
                    **os.environ,
                    "PYTHONPATH": os.pathsep.join([root, os.path.join(root, "integrations")]),
                }
                done = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--child", server.url],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                    cwd=root,
                    timeout=600,
                )
                results[which].append(json.loads(done.stdout))
    print(f"{'hit':24s} {'old (us)':>9s} {'new (us)':>9s} {'new/old':>8s}")
    for case in results["old"][0]:
        old = statistics.median(r[case] for r in results["old"])
        new = statistics.median(r[case] for r in results["new"])
        print(f"{case:24s} {old:9.2f} {new:9.2f} {new / old:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
