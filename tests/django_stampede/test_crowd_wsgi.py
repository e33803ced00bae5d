"""A crowd at one cold page of one Django process under a real WSGI server.

N requests at once, through waitress with N threads, for a page that takes
half a second to render: one render, every request answered with it, and
the Redis connections of the server process not growing with N. redis-py's
pools hold at most 100 connections and raise at once when empty, so at
N = 400 a design in which each waiting request held a connection fails.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from stampede._async.reads import MOST_READS
from stampede.testing import ConnectionPeak, RedisServer
from tests.crowd import PAGES, READERS, CrowdServer, group_invalidated_while_read
from tests.django_stampede.project import served

pytestmark = pytest.mark.slow

#: Redis connections the server process may open for a whole crowd: the
#: first reads (those who come while a GET of the page is in flight share one
#: sent when it is back or 2 ms on, never more than MOST_READS in flight),
#: the leader's commands and the subscriber; not one per waiting request
#: (50 or 100 and more here, and 400, past the pool's 100).
MOST_CONNECTIONS = MOST_READS + 10


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[dict[str, Any], int], CrowdServer]]:
    """Starts the test project under waitress with ``CACHES`` and a number of
    threads; stopped after the test, whatever happens."""
    with ExitStack() as running:

        def start(caches: dict[str, Any], threads: int) -> CrowdServer:
            env = served.environment(caches, urls="tests.django_stampede.project.crowd_views")
            server = CrowdServer(
                "tests.django_stampede.project.served:wsgi", env, threads=threads, workdir=tmp_path
            )
            return running.enter_context(server)

        yield start


@pytest.mark.parametrize("n", [50, 400])
@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/page", id="cache_page"),  # Django's own decorator, a sync view
        pytest.param("/get-or-set", id="get_or_set"),  # cache.get_or_set(key, render, 60) in a sync view
    ],
)
def test_a_crowd_at_a_cold_page_gets_one_render(
    serve: Callable[[dict[str, Any], int], CrowdServer],
    server: RedisServer,
    namespace: str,
    path: str,
    n: int,
) -> None:
    # The test's own redis-server: its connections are this server process's alone.
    caches = {
        "default": {
            "BACKEND": "django_stampede.StampedeCache",
            "LOCATION": server.url,
            "OPTIONS": {"NAMESPACE": namespace},
        }
    }
    app = serve(caches, n)
    with ConnectionPeak(server.url) as connections:
        answers = app.crowd(path, n)
    failed = Counter(f"{status}: {body[:200]}" for status, body in answers if status != 200)
    assert not failed, f"{failed}\n{app.output()}"
    bodies = Counter(body for _, body in answers)
    assert len(bodies) == 1, bodies
    assert app.renders() == 1
    assert "Traceback" not in app.output(), app.output()
    assert connections.error is None
    assert connections.peak <= MOST_CONNECTIONS


@pytest.mark.parametrize("how", ["invalidate_tags", "delete_tags"])
def test_a_group_invalidated_while_read_renders_each_page_once(
    serve: Callable[[dict[str, Any], int], CrowdServer], server: RedisServer, namespace: str, how: str
) -> None:
    caches = {
        "default": {
            "BACKEND": "django_stampede.StampedeCache",
            "LOCATION": server.url,
            "OPTIONS": {"NAMESPACE": namespace, "STALE_TTL": 600},
        }
    }
    app = serve(caches, READERS)
    answers = group_invalidated_while_read(app, server.url, namespace, how)
    failed = Counter(f"{status}: {body[:200]}" for status, body in answers if status != 200)
    assert not failed, f"{failed}\n{app.output()}"
    assert app.renders() == 2 * PAGES  # each page once more, however many read it
    assert "Traceback" not in app.output(), app.output()
