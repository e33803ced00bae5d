"""stampede's benchmarks: ``python -m bench NAME [options]`` runs one, ``python -m bench`` lists them.

Each benchmark lives in the folder of what it measures; ``bench/README.md``
says, for each, the claim of the documentation it backs, the command, how
long it takes and what it needs.

- :mod:`bench.herd`: stampede beside its peers with many callers of one key
  (``herd``, what ``make bench`` runs; ``topologies``).
- :mod:`bench.load`: stampede's entry points and app servers under load
  (``manywaiters``, ``sustained``, ``unwritten``).
- :mod:`bench.faults`: what Redis going wrong costs (``eviction``, ``failover``).
- :mod:`bench.groups`: tags and batches (``groups``, ``grouppeers``).
- :mod:`bench.costs`: what one hit or one entry costs (``nearhit``,
  ``footprint``, ``versus``).

What several of them use: :mod:`bench.peers`, each peer (the caches a user
would pick instead of stampede) wrapped once, one module per library; and
:mod:`bench._common`, the Markdown report, statistics, timing loops, the
redis-server binaries, the cached value.
"""
