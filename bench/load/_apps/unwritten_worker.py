"""A worker process of the never-written-key scenario: no HTTP, Django set up with the site's
``CACHES`` (:mod:`bench.load._apps.unwritten_config`), as a task queue's worker or a management command
runs.

``python -m bench.load._apps.unwritten_worker SECONDS PAUSE``: sets Django up and makes the cache
backend (its modules imported, its connection pool made, no command sent: as a worker whose
start-up touched the cache, so that the reads time the cache, not Python's imports), prints
``ready``, waits
for a line on stdin, then for ``SECONDS`` reads a key nobody ever writes (``cache.get``) and
sleeps ``PAUSE`` seconds, again and again; prints one JSON object: the loops, each read's time in
seconds, the errors by name, and the seconds the loop took. Its stderr carries the cache's
warnings.
"""

from __future__ import annotations

import collections
import json
import sys
import time

import django
from django.conf import settings

from .unwritten_config import WORKER_FLAG, AppConfig
from .unwritten_config import settings as site_settings


def main() -> None:
    seconds, pause = float(sys.argv[1]), float(sys.argv[2])
    settings.configure(**site_settings(AppConfig.from_env()))
    django.setup()
    from django.core.cache import cache, caches

    caches["default"]  # made now: the first read would otherwise time the backend's imports

    print("ready", flush=True)
    sys.stdin.readline()
    gets: list[float] = []
    errors: collections.Counter[str] = collections.Counter()
    started = time.monotonic()
    end = started + seconds
    while time.monotonic() < end:
        before = time.perf_counter()
        try:
            cache.get(WORKER_FLAG)
        except Exception as exc:  # counted, and the loop goes on, as a worker's would
            errors[type(exc).__name__] += 1
        gets.append(time.perf_counter() - before)
        time.sleep(pause)
    elapsed = time.monotonic() - started
    print(json.dumps({"loops": len(gets), "gets": gets, "errors": errors, "elapsed": elapsed}), flush=True)


if __name__ == "__main__":
    main()
