"""Many callers of one key: stampede beside its peers, and on one server beside a cluster.

- :mod:`.sidebyside`: ``python -m bench herd`` (``make bench``), every peer
  on its own redis-server, run by one set of worker processes
  (:mod:`._runner`, :mod:`._workers`, :mod:`._meter`) through its scenarios:
  :mod:`.hitpath` (a hit), :mod:`.cold` (a cold key, 64 callers at once),
  :mod:`.hot` (a hot key expiring every second), :mod:`.coherence` (a reader
  beside a writer, for the near caches); the table of them all
  (:mod:`.summary`) and its PNG (:mod:`.plot`).
- :mod:`.topologies`: ``python -m bench topologies``, stampede alone on one
  server and on a 3-master cluster.
"""
