"""What Redis going wrong costs the callers.

- :mod:`.eviction`: ``python -m bench eviction``, a keyspace larger than
  ``maxmemory`` under each eviction policy.
- :mod:`.failover`: ``python -m bench failover``, the master of a key killed
  under load, on a Cluster and under Sentinel.
"""
