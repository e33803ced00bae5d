"""A request's leases, in the extension's ``cached`` and in the Flask-Caching backend: renewed
while the request renders, given back when it ends without a write, and a key that requests read
and never write makes nobody wait. Counts, never durations."""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator

import flask_stampede
import pytest
from flask import Flask, Response
from flask_caching import Cache

from stampede import EventKind
from tests.flask_stampede.test_views import fetch
from tests.helpers import run_threads
from tests.observers import record, recorded

_namespaces = itertools.count()
CLIENTS = 32
RENDER = 1.5
LEASE_TTL = 0.5


class Renders:
    """How many times a view ran."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            self.count += 1
            return self.count


@pytest.fixture
def app() -> Iterator[Flask]:
    namespace = f"flask-scopes{os.getpid()}-{next(_namespaces)}"
    url = os.environ["STAMPEDE_TEST_REDIS_URL"]
    app = Flask(__name__)
    app.config.update(
        SECRET_KEY="flask-scopes-test-not-secret",
        STAMPEDE_REDIS_URL=url,
        STAMPEDE_NAMESPACE=namespace,
        STAMPEDE_LEASE_TTL=LEASE_TTL,
        STAMPEDE_ON_EVENT=record,
        CACHE_TYPE="flask_stampede.StampedeCache",
        CACHE_REDIS_URL=url,
        CACHE_DEFAULT_TIMEOUT=60,
        CACHE_OPTIONS={"namespace": namespace + "-fc", "lease_ttl": LEASE_TTL, "on_event": record},
    )
    yield app
    if "stampede" in app.extensions:
        app.extensions["stampede"].core.client.close()
    for backend in app.extensions.get("cache", {}).values():
        backend.stampede.client.close()


def _count(namespace: str, kind: EventKind) -> int:
    return recorded(namespace).count(kind)


def test_flask_caching_a_key_read_and_never_written_makes_nobody_wait(
    app: Flask, serve: Callable[[Flask], str]
) -> None:
    cache = Cache(app)

    @app.get("/flag")
    def flag() -> str:
        shown = cache.get("maintenance-mode")
        time.sleep(0.05)
        return "on" if shown else "off"

    url = serve(app) + "/flag"
    answers = run_threads(CLIENTS, lambda: [fetch(url)[:2] for _ in range(5)])
    assert answers == [[(200, "off")] * 5] * CLIENTS
    namespace = app.config["CACHE_OPTIONS"]["namespace"]
    assert _count(namespace, EventKind.LEASE_WON) <= 2
    assert _count(namespace, EventKind.UNFILLED) >= 1
    assert _count(namespace, EventKind.WAIT_TIMEOUT) == 0


def test_flask_caching_a_view_slower_than_its_lease_renders_once(
    app: Flask, serve: Callable[[Flask], str]
) -> None:
    cache = Cache(app)
    renders = Renders()

    @app.get("/slow")
    @cache.cached()
    def slow() -> str:
        time.sleep(RENDER)  # three lease times: renewed while the request runs
        return f"render {renders()}"

    url = serve(app) + "/slow"
    assert run_threads(8, lambda: fetch(url)[:2]) == [(200, "render 1")] * 8
    assert renders.count == 1
    assert _count(app.config["CACHE_OPTIONS"]["namespace"], EventKind.WAIT_TIMEOUT) == 0


def test_cached_a_view_slower_than_its_lease_renders_once(app: Flask, serve: Callable[[Flask], str]) -> None:
    ext = flask_stampede.Stampede(app)
    renders = Renders()

    @app.get("/slow")
    @ext.cached(ttl=60)
    def slow() -> str:
        time.sleep(RENDER)
        return f"render {renders()}"

    url = serve(app) + "/slow"
    assert run_threads(8, lambda: fetch(url)[:2]) == [(200, "render 1")] * 8
    assert renders.count == 1
    assert _count(app.config["STAMPEDE_NAMESPACE"], EventKind.WAIT_TIMEOUT) == 0


def test_cached_a_page_never_stored_makes_nobody_wait_and_is_stored_once_it_can_be(
    app: Flask, serve: Callable[[Flask], str]
) -> None:
    ext = flask_stampede.Stampede(app)
    renders = Renders()
    published = threading.Event()

    @app.get("/article")
    @ext.cached(ttl=60)
    def article() -> Response | tuple[str, int]:
        count = renders()
        time.sleep(0.05)
        return (f"render {count}", 200) if published.is_set() else ("not yet", 404)

    url = serve(app) + "/article"
    assert run_threads(CLIENTS, lambda: fetch(url)[0]) == [404] * CLIENTS
    namespace = app.config["STAMPEDE_NAMESPACE"]
    assert _count(namespace, EventKind.LEASE_WON) <= 2  # then remembered as a page nobody stores
    assert _count(namespace, EventKind.WAIT_TIMEOUT) == 0
    published.set()
    first = fetch(url)[1]
    assert first.startswith("render ")
    # Stored by that render, though no lease was taken for it: served from now on.
    assert [fetch(url)[1] for _ in range(3)] == [first] * 3


def test_cached_gives_its_lease_back_whatever_fails_after_the_view(app: Flask) -> None:
    ext = flask_stampede.Stampede(app)

    def broken_filter(response: Response) -> bool:
        raise RuntimeError("a broken response_filter")

    @app.get("/filtered")
    @ext.cached(ttl=60, response_filter=broken_filter)
    def filtered() -> str:
        return "page"

    app.testing = True
    with pytest.raises(RuntimeError, match="a broken response_filter"):
        app.test_client().get("/filtered")
    with app.app_context():
        core = ext.stampede
        lease = core.client.get(core._keys("view//filtered").lease)
    # Given back at once (a failed unit of work: no unfilled mark), not kept
    # and renewed until max_lease_time.
    assert lease is None
    assert len(core._keeper) == 0
