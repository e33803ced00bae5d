"""The side-by-side benchmark of stampede and its peers: ``python -m bench`` (see ``bench/__main__.py``).

The peers (:mod:`bench.peers`) are what a user would pick instead: naive
cache-aside, Django's ``RedisCache.get_or_set``, dogpile.cache with a
distributed lock, redis-py's ``Lock`` around cache-aside, Flask-Caching's
``memoize``, cashews (a lock, soft TTL, early refresh), aiocache's
``RedLock``, django-redis's ``HerdClient`` (:mod:`bench.herdpeers`), near
caches (cashews' client-side mode, redis-py's and coredis's client-side
caches, :mod:`bench.nearpeers`), and stampede's sync and asyncio drivers
(each also with ``signing_key=``, in the hit scenario only, and with
``near_cache=``), each against a redis-server of its own
(:mod:`bench._servers` picks a newer one for a peer that needs it). Three
scenarios: the cost of a hit
(:mod:`bench.hitpath`), a cold key hit by 64 callers at once
(:mod:`bench.cold`), and a hot key expiring every second under the same load
(:mod:`bench.hot`), run by one set of worker processes (:mod:`bench._load`,
:mod:`bench._workers`). A fourth, many waiters (:mod:`bench.manywaiters`),
has N = 50, 150 and 400 callers of one process miss one cold key through each
of stampede's entry points (the core, sync and asyncio; Django and Flask
views under waitress or uvicorn, :mod:`bench._apps`) and counts renders,
errors and Redis connections. A fifth, coherence (:mod:`bench.coherence`),
has one process write a key every 3 ms while another reads it through the
peer, and counts the reads older than a write that had returned. The
results are Markdown tables (:mod:`bench.summary`, :mod:`bench.report`) and
a PNG (:mod:`bench.plot`).
"""
