"""``python -m bench NAME [options]``: run the benchmark NAME; ``python -m bench`` lists them.

Every benchmark is a module with ``main(argv)``, in the folder of what it
measures (:data:`BENCHMARKS` names both); its options are its own
(``python -m bench NAME --help``). ``bench/README.md`` says what each one
measures, the claim of the documentation it backs, how long it takes and
what it needs.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["BENCHMARKS", "Benchmark", "main"]


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: its name on the command line, its module (below ``bench``), and what it
    measures, in a line."""

    name: str
    module: str
    about: str

    @property
    def folder(self) -> str:
        return f"bench/{self.module.rpartition('.')[0].replace('.', '/')}/"


#: Every benchmark, by folder: the order of ``python -m bench``'s list and of ``bench/README.md``.
BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark(
        "herd",
        "herd.sidebyside",
        "stampede beside its peers: hit, cold key, hot key, coherence; then manywaiters, sustained, "
        "unwritten, topologies",
    ),
    Benchmark(
        "topologies",
        "herd.topologies",
        "the cold and the hot key on one server and on a 3-master cluster",
    ),
    Benchmark(
        "manywaiters",
        "load.manywaiters",
        "N callers of one process on one cold key, through each entry point",
    ),
    Benchmark(
        "sustained",
        "load.sustained",
        "150 clients on one cached page for 15 s, under each app server",
    ),
    Benchmark(
        "unwritten",
        "load.unwritten",
        "a key read and never written; a render slower than its lease",
    ),
    Benchmark(
        "eviction",
        "faults.eviction",
        "a keyspace larger than maxmemory, under each eviction policy; every read checked",
    ),
    Benchmark(
        "churn",
        "faults.churn",
        "10 minutes of key churn with tags, batches, a near cache and cancelled waits: memory stays flat",
    ),
    Benchmark(
        "failover",
        "faults.failover",
        "a master killed under load (Cluster, Sentinel), beside plain redis-py",
    ),
    Benchmark(
        "outage",
        "faults.outage",
        "Redis killed or frozen under a cached Django page and the core, beside the stock peers",
    ),
    Benchmark(
        "storm",
        "faults.storm",
        "a database that keeps failing under one key, hot and cold, beside dogpile.cache",
    ),
    Benchmark(
        "groups",
        "groups.tags",
        "a tagged hit's cost, and how soon another process sees invalidate_tags",
    ),
    Benchmark(
        "grouppeers",
        "groups.grouppeers",
        "groups and batches beside cashews' tags and dogpile.cache's batches",
    ),
    Benchmark(
        "nearhit",
        "costs.nearhit",
        "a hit from process memory beside the in-process floor and the peers",
    ),
    Benchmark(
        "footprint",
        "costs.footprint",
        "Redis bytes per entry through each store, beside Django's RedisCache",
    ),
    Benchmark(
        "versus",
        "costs.versus",
        "a hit's CPU time in two checkouts of stampede (OLD NEW)",
    ),
)

USAGE = "python -m bench NAME [options]    (python -m bench NAME --help: its options)"


def listing() -> str:
    """The benchmarks under their folders, one a line: its name and what it measures."""
    width = max(len(benchmark.name) for benchmark in BENCHMARKS)
    lines = [USAGE]
    folder = ""
    for benchmark in BENCHMARKS:
        if benchmark.folder != folder:
            folder = benchmark.folder
            lines += ["", folder]
        lines.append(f"  {benchmark.name.ljust(width)}  {benchmark.about}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("--list", "-h", "--help"):
        print(listing())
        return 0
    name, rest = args[0], args[1:]
    chosen = next((benchmark for benchmark in BENCHMARKS if benchmark.name == name), None)
    if chosen is None:
        hint = (
            " (name the benchmark first: make bench's side-by-side run is `herd`)" if name[:1] == "-" else ""
        )
        print(f"python -m bench: no benchmark named {name!r}{hint}\n\n{listing()}", file=sys.stderr)
        return 2
    run: Callable[[Sequence[str]], int | None] = importlib.import_module(f"bench.{chosen.module}").main
    return run(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
