"""A Flask site under waitress with fail-open while its Redis goes away
(stopped, or frozen as behind a firewall that drops packets) and comes
back: every request is answered 200, through ``flask_stampede``'s
``@stampede.cached`` and Flask-Caching's ``@cache.cached`` on stampede's
backend, and the requests of the process share each render meanwhile."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from stampede.testing import RedisServer
from tests.crowd import CrowdServer, read_through_an_outage
from tests.flask_stampede import crowd_app

pytestmark = pytest.mark.slow

CLIENTS = 30
#: Connections that give up on a Redis that does not answer after a second.
TIMEOUTS = {"socket_timeout": 1, "socket_connect_timeout": 1}


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], CrowdServer]]:
    with ExitStack() as running:

        def start(config: dict[str, Any]) -> CrowdServer:
            env = crowd_app.environment(config)
            server = CrowdServer("tests.flask_stampede.crowd_app:app", env, threads=CLIENTS, workdir=tmp_path)
            return running.enter_context(server)

        yield start


def stampede_config(url: str, namespace: str) -> dict[str, Any]:
    return {
        "CROWD_ENTRY": "stampede",
        "STAMPEDE_REDIS_URL": url,
        "STAMPEDE_NAMESPACE": namespace,
        "STAMPEDE_FAIL_OPEN": True,
        "STAMPEDE_REDIS_OPTIONS": TIMEOUTS,
    }


def flask_caching_config(url: str, namespace: str) -> dict[str, Any]:
    return {
        "CROWD_ENTRY": "flask-caching",
        "CACHE_TYPE": "flask_stampede.StampedeCache",
        "CACHE_REDIS_URL": url,
        "CACHE_OPTIONS": {"namespace": namespace, "fail_open": True, "redis_options": TIMEOUTS},
    }


@pytest.mark.parametrize("fault", ["stopped", "frozen"])
@pytest.mark.parametrize(
    "configure",
    [
        pytest.param(stampede_config, id="stampede.cached"),
        pytest.param(flask_caching_config, id="flask_caching"),
    ],
)
def test_every_request_is_answered_while_redis_is_away_and_after(
    serve: Callable[[dict[str, Any]], CrowdServer],
    server: RedisServer,
    namespace: str,
    configure: Callable[[str, str], dict[str, Any]],
    fault: str,
) -> None:
    app = serve(configure(server.url, namespace))
    statuses, renders_away, answered_away = read_through_an_outage(app, server, ["/page"], CLIENTS, fault)
    assert statuses == [200] * len(statuses), app.output()
    # Without Redis, the requests of the process share each render (one at
    # a time, kept for the page's ttl), rather than render one each.
    assert renders_away * 4 <= answered_away, (renders_away, answered_away)
