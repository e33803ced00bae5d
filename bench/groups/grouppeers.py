"""Groups (tags) and batches beside their closest peers, in one run, on one redis-server.

``python -m bench grouppeers [--quick]`` starts its own redis-server
(:class:`stampede.testing.RedisServer`) and runs every case on it, one after
another, the server flushed between cases. Worker processes are spawned
(``multiprocessing``'s ``spawn``); rebuilds are counted in Redis (``INCR`` of a
counter key), so that processes add up. Commands are counted with ``MONITOR``
on an otherwise idle server: those the client sent, and apart from them
those run inside server-side scripts (``INFO``'s ``total_commands_processed``
counts both on this Redis, so it cannot tell them apart).

1. A group invalidated under load. N entries (200; 40 with ``--quick``), each
   tagged ``group``, are cached; then P processes x T asyncio tasks (4 x 8;
   2 x 8 with ``--quick``) read every entry in turn, in a loop, with a 5 ms
   pause between calls, and the group is invalidated once, from this
   process, 1 s into the load (0.5 s with ``--quick``). The load goes on
   until Redis holds a rebuilt value of every entry (at least 1.5 s, at most
   25 s; 1 s and 10 s with ``--quick``). It runs twice: with the callers
   starting spread evenly over the entries (an entry is rarely read by two
   at once), and with every caller walking them in the same order from the
   first (the readers of one page that lists the group: they meet on each
   entry). The readers are asyncio tasks for both libraries, as cashews has
   no blocking API: stampede as ``stampede.asyncio.Stampede``
   (``tag_check_interval=0.1``) with ``invalidate_tags`` (soft), the same with
   ``background=True``, and ``delete_tags`` (hard); cashews as
   ``@cache(ttl=..., key=..., tags=["group"])`` (its default ``protected=True``
   makes one process's calls of a key share one task), and the same with
   ``lock=True`` (its lock across processes), both invalidated with
   ``delete_tags("group")``, the only group invalidation cashews has. A
   rebuild INCRs the counter and sleeps 50 ms. Reported: rebuilds per entry
   (ideal 1.0); the calls made after the invalidation, and how many took
   over 25 ms (they waited for a rebuild, their own or another caller's; the
   share before the invalidation is the machine's noise); stampede's own
   counts of stale values served, misses and waits (``on_event``); the time
   from the invalidation to the end of the first rebuild begun after it, for
   the last entry to get one. Apart, on the quiet server just before the
   load (the N entries cached, the same invalidation once): the commands it
   sent, those run inside scripts, and the call's wall time.
2. A cold batch. P processes (8; 4 with ``--quick``), lined up on a barrier,
   ask at once for the same 100 missing keys, once per round (3; 1 with
   ``--quick``, new keys each round): ``Stampede.get_or_rebuild_many``
   against dogpile.cache's ``region.get_or_create_multi`` on its
   ``dogpile.cache.redis`` backend with ``distributed_lock=True`` (and
   ``thread_local_lock=False``, as its docs ask; Redis keeps a value 600 s past
   dogpile's expiration time, as its docs advise, so that an expired one can
   be served while one caller regenerates). Both blocking, one caller per
   process; the batch rebuild INCRBYs the counter by the number of keys it
   is given, then sleeps 50 ms (one query for the batch). Reported: rebuilds
   per key (ideal 1.0), the callers that rebuilt anything, the slowest
   caller. Then a warm batch of 100 keys in this process: commands per batch
   call, and CPU microseconds per call in this process
   (``time.process_time``, best of 3 blocks), beside a plain ``MGET`` and
   unpickling as the floor.
3. A warm tagged hit: CPU microseconds and commands per hit, in this
   process, for ``stampede.asyncio``'s ``get_or_rebuild`` (untagged and
   tagged) and cashews' ``@cache(tags=...)`` (without and with ``lock=True``).

Every number comes from the same run on the same machine: read them as
ratios side by side. Nothing is asserted about wall-clock times.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
from collections.abc import Sequence

import redis
import redis.asyncio

from stampede.testing import RedisServer

from .._common.report import Section, environment_line, progress, render_section
from ._readers import TAG_CASES
from ._workload import FULL, QUICK
from .batches import batch_sections, run_cold_batch, warm_batch_cost
from .invalidation import LAYOUTS, TagResult, run_tag_case, tag_sections
from .taggedhit import HIT_CASES, hit_cost, hit_section

__all__ = ["main"]


def missing_peers() -> list[str]:
    missing = []
    for module, package in (("cashews", "cashews>=7.0"), ("dogpile.cache", "dogpile.cache>=1.3")):
        try:
            __import__(module)
        except ImportError:
            missing.append(package)
    return missing


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench grouppeers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer entries, processes and rounds (under 60 s)"
    )
    args = parser.parse_args(argv)
    missing = missing_peers()
    if missing:
        parser.exit(2, f"the peers are not installed: pip install {' '.join(repr(p) for p in missing)}\n")
    scale = QUICK if args.quick else FULL
    context = multiprocessing.get_context("spawn")
    sections: list[Section] = []
    with RedisServer() as server:
        url = server.url
        version = str(redis.Redis.from_url(url).info("server")["redis_version"])
        by_layout: dict[bool, list[TagResult]] = {True: [], False: []}
        for spread, *_ in LAYOUTS:
            for case in TAG_CASES:
                progress(f"groups: {case.name}, {'spread' if spread else 'same order'}")
                result = asyncio.run(run_tag_case(case, url, scale, context, spread=spread))
                by_layout[spread].append(result)
        sections.extend(tag_sections(by_layout[True], by_layout[False], scale))
        cold = []
        for library in ("stampede", "dogpile"):
            progress(f"cold batch: {library}")
            cold.append(run_cold_batch(library, url, scale, context))
        warm = []
        redis.Redis.from_url(url).flushall()
        for library in ("stampede", "stampede-tagged", "dogpile", "plain"):
            progress(f"warm batch: {library}")
            warm.append(warm_batch_cost(library, url, scale))
        sections.extend(batch_sections(cold, warm, scale))
        hits = []
        for label, make in HIT_CASES:
            progress(f"hit: {label}")
            hits.append(asyncio.run(hit_cost(label, make, url, scale.hit_calls)))
        sections.append(hit_section(hits, scale))
    print(environment_line(version, quick=args.quick))
    print()
    print("# stampede's groups and batches beside their peers")
    for section in sections:
        print()
        print(render_section(section))
