"""The side-by-side benchmark of stampede and its peers: ``python -m bench`` (see ``bench/__main__.py``).

The peers (:mod:`bench.peers`) are what a user would pick instead: naive
cache-aside, Django's ``RedisCache.get_or_set``, dogpile.cache with a
distributed lock, redis-py's ``Lock`` around cache-aside, Flask-Caching's
``memoize``, and stampede's sync and asyncio drivers (each also with
``signing_key=``, in the hit scenario only), each against a redis-server of
its own. Three scenarios: the cost of a hit
(:mod:`bench.hitpath`), a cold key hit by 64 callers at once
(:mod:`bench.cold`), and a hot key expiring every second under the same load
(:mod:`bench.hot`), run by one set of worker processes (:mod:`bench._load`,
:mod:`bench._workers`). A fourth, many waiters (:mod:`bench.manywaiters`),
has N = 50, 150 and 400 callers of one process miss one cold key through each
of stampede's entry points (the core, sync and asyncio; Django and Flask
views under waitress or uvicorn, :mod:`bench._apps`) and counts renders,
errors and Redis connections. The results are Markdown tables
(:mod:`bench.summary`, :mod:`bench.report`) and a PNG (:mod:`bench.plot`).
"""
