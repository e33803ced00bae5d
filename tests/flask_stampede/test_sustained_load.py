"""Flask under load that lasts: clients asking for a page again and again across several expiries,
through gunicorn's gthread and gevent workers and, behind an ASGI adapter (a2wsgi), uvicorn
(``bench.load._sustained``).

``@stampede.cached`` on sync and async views and Flask-Caching's ``@cache.cached``
on ``flask_stampede.StampedeCache`` render a page at most once per window, answer
every request with 200 and hold few Redis connections per process; under gevent
an uncached page is answered while a crowd waits for a render. Flask's async
views are not run under gevent: Flask itself cannot (asyncio sees one running
loop per OS thread, which all greenlets share), with or without stampede.
"""

from __future__ import annotations

import itertools
import os

import pytest

from bench.load import _sustained
from support.app_servers import SERVERS
from tests.sustained import RENDER_SECONDS, TTL, check_load, check_meanwhile

_namespaces = itertools.count()

#: The servers, and the pages each serves: ``/page`` (``@stampede.cached``), ``/fc-page``
#: (Flask-Caching on stampede's backend), ``/apage`` (an async view under ``@stampede.cached``).
PAGES = {
    # Not /apage: Flask runs each async view on an event loop of its own, whose client is its own,
    # so a worker's connections follow its busy threads (up to 40 here), not what waits.
    "gunicorn-gthread": ["/page", "/fc-page"],
    "gunicorn-gevent": ["/page", "/fc-page"],
    "uvicorn": ["/apage", "/page"],
}


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.parametrize("name", list(PAGES))
def test_each_page_is_rendered_once_per_window_with_no_error(name: str, redis_url: str) -> None:
    server = SERVERS[name]
    missing = server.missing()
    if missing:
        pytest.fail(f"{server.described} needs {', '.join(missing)}: install the test extra")
    with _sustained.app(
        server,
        "flask",
        backend="stampede",
        redis_url=redis_url,
        namespace=f"fsustained{os.getpid()}-{next(_namespaces)}",
        ttl=TTL,
        render_seconds=RENDER_SECONDS,
    ) as served:
        if server.interface == "wsgi" and server.waits_free:  # gevent; behind the adapter, threads wait
            check_meanwhile(served, PAGES[name][0])
        for page in PAGES[name]:
            check_load(served, page)
