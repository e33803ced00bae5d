"""Groups (tags) and batches.

- :mod:`.tags`: ``python -m bench groups``, stampede alone: what a tagged hit
  costs beside an untagged one, and how soon another process sees
  ``invalidate_tags``.
- :mod:`.grouppeers`: ``python -m bench grouppeers``, beside the closest
  peers, in three parts: a group invalidated under load
  (:mod:`.invalidation`, its reader processes in :mod:`._readers`), a cold
  and a warm batch (:mod:`.batches`), a warm tagged hit (:mod:`.taggedhit`);
  what they share: the workload and its sizes (:mod:`._workload`), commands
  counted with ``MONITOR`` (:mod:`._monitor`), the worker processes
  (:mod:`._processes`).
"""
