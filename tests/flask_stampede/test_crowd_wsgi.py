"""A crowd at one cold page of one Flask process under a real WSGI server.

N requests at once, through waitress with N threads, for a page that takes
half a second to render, cached by ``flask_stampede``'s own decorator or by
Flask-Caching's on ``flask_stampede``'s backend: one render, every request
answered with it, and the Redis connections of the server process not
growing with N (redis-py's pools hold at most 100 and raise at once when
empty: at N = 400, a connection per waiting request fails).
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
from tests.flask_stampede import crowd_app

pytestmark = pytest.mark.slow

#: Redis connections the server process may open for a whole crowd: the
#: first reads (those who come while a GET of the page is in flight share one
#: sent when it is back or 2 ms on, never more than MOST_READS in flight),
#: the leader's commands and the subscriber; not one per waiting request
#: (50 or 100 and more here, and 400, past the pool's 100).
MOST_CONNECTIONS = MOST_READS + 10


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[dict[str, Any], int], CrowdServer]]:
    """Starts a crowd app (``tests/flask_stampede/crowd_app.py``) under waitress
    with a config and a number of threads; stopped after the test, whatever happens."""
    with ExitStack() as running:

        def start(config: dict[str, Any], threads: int) -> CrowdServer:
            env = crowd_app.environment(config)
            server = CrowdServer("tests.flask_stampede.crowd_app:app", env, threads=threads, workdir=tmp_path)
            return running.enter_context(server)

        yield start


def stampede_config(url: str, namespace: str) -> dict[str, Any]:
    """``@stampede.cached(ttl=60)`` from ``flask_stampede.Stampede(app)``."""
    return {"CROWD_ENTRY": "stampede", "STAMPEDE_REDIS_URL": url, "STAMPEDE_NAMESPACE": namespace}


def flask_caching_config(url: str, namespace: str) -> dict[str, Any]:
    """Flask-Caching's ``@cache.cached(timeout=60)`` on stampede's backend."""
    return {
        "CROWD_ENTRY": "flask-caching",
        "CACHE_TYPE": "flask_stampede.StampedeCache",
        "CACHE_REDIS_URL": url,
        "CACHE_OPTIONS": {"namespace": namespace},
    }


@pytest.mark.parametrize("n", [50, 400])
@pytest.mark.parametrize(
    "configure",
    [
        pytest.param(stampede_config, id="stampede.cached"),
        pytest.param(flask_caching_config, id="flask_caching"),
    ],
)
def test_a_crowd_at_a_cold_page_gets_one_render(
    serve: Callable[[dict[str, Any], int], CrowdServer],
    server: RedisServer,
    namespace: str,
    configure: Callable[[str, str], dict[str, Any]],
    n: int,
) -> None:
    # The test's own redis-server: its connections are this server process's alone.
    app = serve(configure(server.url, namespace), n)
    with ConnectionPeak(server.url) as connections:
        answers = app.crowd("/page", n)
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
    config = {**stampede_config(server.url, namespace), "STAMPEDE_STALE_TTL": 600}
    app = serve(config, READERS)
    answers = group_invalidated_while_read(app, server.url, namespace, how)
    failed = Counter(f"{status}: {body[:200]}" for status, body in answers if status != 200)
    assert not failed, f"{failed}\n{app.output()}"
    assert app.renders() == 2 * PAGES  # each page once more, however many read it
    assert "Traceback" not in app.output(), app.output()
