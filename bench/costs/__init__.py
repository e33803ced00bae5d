"""What one hit or one entry costs, in one process with nothing else running.

- :mod:`.nearhit`: ``python -m bench nearhit``, a hit from process memory and
  a remote one, each beside its floor and the peers.
- :mod:`.footprint`: ``python -m bench footprint``, the Redis memory of one
  entry through each store.
- :mod:`.versus`: ``python -m bench versus OLD NEW``, a hit's CPU time in two
  checkouts of stampede.
"""
