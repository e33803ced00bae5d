"""What a hit costs in two checkouts of stampede, side by side in one run.

``python -m bench versus OLD NEW [--rounds 8]``: ``OLD`` and ``NEW`` are
directories holding a checkout (``git worktree add /tmp/old HEAD~1``). Each
round runs this file once per checkout, in a child process whose
``PYTHONPATH`` puts that checkout first, alternating which goes first; the
child times ``get_or_rebuild`` hits of a small dict (blocking and asyncio,
without and with a near cache) against one redis-server, in CPU time of
the calling process (the round trip's wait is the server's, not ours). The
table shows each case's median over the rounds and ``new/old``.

``--instructions`` counts instead of timing, for a figure that shared,
noisy cores cannot move: each case runs in a child under ``valgrind
--tool=callgrind`` twice, with no hits and with ``--calls`` hits, and the
difference over the calls is the instructions per hit (the client's: the
server is another process). Slow (a minute per case and checkout), and
needs valgrind.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
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


CASES = ("blocking", "blocking, near cache", "asyncio", "asyncio, near cache")
#: How many times more near hits than remote hits a count makes.
NEAR_CALLS = 20


def _count_child(url: str, case: str, calls: int) -> None:
    """Set ``case`` up as :func:`_child` does, then make ``calls`` hits of it, untimed
    (valgrind counts the instructions of the whole process)."""
    import redis
    import redis.asyncio

    import stampede
    import stampede.asyncio

    near = 1000 if case.endswith("near cache") else None
    if near:
        calls *= NEAR_CALLS  # a near hit is short: more of them, to drown the listener thread's work
    # The namespace's state read once: under valgrind a hit is slow, and its state would lapse.
    options: dict[str, Any] = {"namespace": f"count-{near}", "near_cache": near, "tag_check_interval": 60}
    if case.startswith("blocking"):
        with stampede.Stampede(redis.Redis.from_url(url, socket_timeout=5), **options) as sf:
            for _ in range(2):
                sf.get_or_rebuild("k", lambda: VALUE, ttl=3600)
                time.sleep(0.2)  # the near cache's tracking is live by then
            for _ in range(calls):
                sf.get_or_rebuild("k", lambda: VALUE, ttl=3600)
        return

    async def run() -> None:
        async def avalue() -> Any:
            return VALUE

        asf = stampede.asyncio.Stampede(redis.asyncio.Redis.from_url(url, socket_timeout=5), **options)
        for _ in range(2):
            await asf.get_or_rebuild("k", avalue, ttl=3600)
            await asyncio.sleep(0.2)
        for _ in range(calls):
            await asf.get_or_rebuild("k", avalue, ttl=3600)
        await asf.aclose()
        await asf.client.aclose()

    asyncio.run(run())


def _instructions(root: str, url: str, case: str, calls: int) -> int:
    """The instructions a child for ``case`` under checkout ``root`` ran in all, per callgrind."""
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            os.path.abspath(__file__),
            "--count-child",
            url,
            case,
            str(calls),
        ],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([root, os.path.join(root, "integrations")])},
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
        timeout=1800,
    )
    found = re.search(r"refs:\s+([\d,]+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output: {done.stderr[-500:]}")
    return int(found.group(1).replace(",", ""))


def _count(checkouts: dict[str, str], url: str, calls: int) -> None:
    print(f"{'hit':24s} {'old (instr)':>12s} {'new (instr)':>12s} {'new/old':>8s}")
    for case in CASES:
        made = calls * (NEAR_CALLS if case.endswith("near cache") else 1)
        per_hit = {
            which: (_instructions(root, url, case, calls) - _instructions(root, url, case, 0)) / made
            for which, root in checkouts.items()
        }
        print(
            f"{case:24s} {per_hit['old']:12.0f} {per_hit['new']:12.0f} {per_hit['new'] / per_hit['old']:8.3f}"
        )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:  # one checkout's timings, run by the parent below
        print(json.dumps(_child(argv[1])))
        return 0
    if argv[:1] == ["--count-child"]:  # one case under valgrind, run by _instructions
        _count_child(argv[1], argv[2], int(argv[3]))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench versus", description=__doc__.splitlines()[0])
    parser.add_argument("old", help="a checkout of stampede (the baseline)")
    parser.add_argument("new", help="another checkout")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--instructions", action="store_true", help="count instructions (valgrind), not time")
    parser.add_argument("--calls", type=int, default=2000, help="hits per case counted (--instructions)")
    args = parser.parse_args(argv)
    from stampede.testing import RedisServer

    results: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    checkouts = {"old": os.path.abspath(args.old), "new": os.path.abspath(args.new)}
    if args.instructions:
        if shutil.which("valgrind") is None:
            parser.error("--instructions needs valgrind (Debian: apt install valgrind)")
        with RedisServer() as server:
            _count(checkouts, server.url, args.calls)
        return 0
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
