"""stampede's entry points and the app servers people deploy with, under load.

- :mod:`.manywaiters`: ``python -m bench manywaiters``, N callers of one
  process on one cold key, through the core and Django's and Flask's cached
  views (the callers: :mod:`._crowd`, :mod:`._http`, :mod:`._manycore`; the
  counted render: :mod:`._renders`).
- :mod:`.sustained`: ``python -m bench sustained``, clients asking for one
  page across several expiries, stock caches beside stampede (the load:
  :mod:`._sustained`; the renders' log: :mod:`._timeline`).
- :mod:`.unwritten`: ``python -m bench unwritten``, a key read and never
  written, and a render slower than its lease.

The web apps they serve, each in a server process of its own, are in
:mod:`._apps`.
"""
