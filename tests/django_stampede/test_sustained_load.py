"""Django under load that lasts: clients asking for a page again and again across several expiries,
through the servers people deploy with, as processes of their own (``bench.load._sustained``).

Each server renders a page at most once per window (the cold start, then once
per expiry, never twice before the page it stored has gone stale), answers
every request with 200, and holds few Redis connections per process whatever
the number of requests waiting. Under the ASGI servers and gevent, an uncached
page is answered while a crowd waits for a render. The app misses a key in its
main thread at start-up, as many sites do. Counts, never durations; the long
run, with stock Django side by side, is ``python -m bench sustained``.
"""

from __future__ import annotations

import itertools
import os

import pytest

from bench.load import _sustained
from tests.sustained import RENDER_SECONDS, TTL, check_load, check_meanwhile, server_named

_namespaces = itertools.count()

ASGI = ["uvicorn", "uvicorn-2", "gunicorn-uvicorn", "hypercorn", "daphne"]
WSGI = ["gunicorn-sync", "gunicorn-gthread", "gunicorn-gevent"]
#: Async views under django_stampede.cache_page, a sync view under Django's cache_page (run in a
#: thread per request by Django's ASGI handler), and cache-aside by hand with aget/aset.
ASGI_PAGES = ["/apage", "/page", "/aaside"]


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.parametrize("name", ASGI + WSGI)
def test_each_page_is_rendered_once_per_window_with_no_error(name: str, redis_url: str) -> None:
    server = server_named(name)
    pages = ASGI_PAGES if server.interface == "asgi" else ["/page"]
    with _sustained.app(
        server,
        "django",
        backend="stampede",
        redis_url=redis_url,
        namespace=f"sustained{os.getpid()}-{next(_namespaces)}",
        ttl=TTL,
        render_seconds=RENDER_SECONDS,
    ) as served:
        if server.waits_free:  # not when each waiting request holds one of a few threads
            check_meanwhile(served, pages[0])
        for page in pages:
            check_load(served, page)
