"""The side-by-side benchmark of stampede: ``python -m bench`` (see ``bench/__main__.py``).

Three scenarios, each against a real redis-server: the cost of a hit
(:mod:`bench.hitpath`), a cold key hit by 64 callers at once
(:mod:`bench.cold`), and a hot key expiring every second under the same load
(:mod:`bench.hot`). The results are Markdown tables (:mod:`bench.report`).
"""
