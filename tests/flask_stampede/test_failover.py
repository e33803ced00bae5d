"""Flask through a failover, configured by settings alone: the extension
(``STAMPEDE_REDIS_URL``) and the Flask-Caching backend (its own
``CACHE_REDIS_SENTINELS``), while threads serve requests and the master dies."""

from __future__ import annotations

import collections
from collections.abc import Iterator

import pytest
from flask import Flask
from flask_caching import Cache
from flask_stampede import Stampede

from tests.failing import Failing
from tests.helpers import close_core

pytestmark = pytest.mark.slow


@pytest.fixture
def failing() -> Iterator[Failing]:
    with Failing("sentinel", None) as setup:
        yield setup


def test_no_error_and_no_extra_render_through_a_failover(failing: Failing, namespace: str) -> None:
    sentinels = failing.setup.sentinel_addresses  # type: ignore[union-attr]
    app = Flask(__name__)
    app.config.update(
        STAMPEDE_REDIS_URL=failing.url,
        STAMPEDE_NAMESPACE=namespace,
        STAMPEDE_WAIT_TIMEOUT=30,
        CACHE_TYPE="flask_stampede.StampedeCache",
        CACHE_REDIS_SENTINELS=sentinels,
        CACHE_REDIS_SENTINEL_MASTER=failing.setup.service,  # type: ignore[union-attr]
        CACHE_KEY_PREFIX=f"{namespace}-fc:",
    )
    ext = Stampede(app)
    cache = Cache(app)
    renders: collections.Counter[str] = collections.Counter()

    @app.route("/page/<int:n>")
    @ext.cached(ttl=60)
    def page(n: int) -> str:
        renders[f"page {n}"] += 1
        return f"page {n}"

    @cache.memoize(timeout=60)
    def square(n: int) -> int:
        renders[f"square {n}"] += 1
        return n * n

    def serve_all(client: object) -> None:
        for n in range(6):
            assert client.get(f"/page/{n}").text == f"page {n}"  # type: ignore[attr-defined]
            with app.app_context():
                assert square(n) == n * n

    serve_all(app.test_client())
    errors = failing.serve_through_failover(  # one master holds every key
        b"any", lambda: serve_all(app.test_client()), threads=8
    )
    with app.app_context():
        close_core(ext.stampede)  # neither core owns its client
        for backend in app.extensions["cache"].values():
            close_core(backend.stampede)
    assert errors == []
    assert set(renders.values()) == {1}
