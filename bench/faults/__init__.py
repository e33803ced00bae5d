"""What Redis going wrong costs the callers.

- :mod:`.eviction`: ``python -m bench eviction``, a keyspace larger than
  ``maxmemory`` under each eviction policy.
- :mod:`.failover`: ``python -m bench failover``, the master of a key killed
  under load, on a Cluster and under Sentinel.
- :mod:`.outage`: ``python -m bench outage``, one Redis killed or frozen and back, under a
  cached Django page and under the core's callers, beside the stock caches. Its parts:
  ``_outages.py`` (the faults and phases), ``_outage_site.py`` (the site and its clients),
  ``_outage_core.py`` (the core's callers).
"""
