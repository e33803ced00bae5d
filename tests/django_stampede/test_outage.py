"""A Django site under waitress with ``FAIL_OPEN`` while its Redis goes away
(stopped, or frozen as behind a firewall that drops packets) and comes back:
every request is answered 200, through ``cache_page`` (whose header lists
are read first), ``get_or_set``, ``{% cache %}`` and cache-aside; and a
removal made meanwhile is sent once Redis answers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

import stampede
from stampede.testing import RedisServer
from tests.crowd import CrowdServer, read_through_an_outage
from tests.django_stampede.project import served
from tests.helpers import wait_until

pytestmark = pytest.mark.slow

CLIENTS = 30
#: Every way a Django site caches: Django's cache_page, get_or_set, the
#: {% cache %} template tag, and cache-aside (a get, and a set on a miss).
PATHS = ["/page", "/get-or-set", "/fragment", "/aside"]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], CrowdServer]]:
    with ExitStack() as running:

        def start(caches: dict[str, Any]) -> CrowdServer:
            env = served.environment(caches, urls="tests.django_stampede.project.crowd_views")
            server = CrowdServer(
                "tests.django_stampede.project.served:wsgi", env, threads=CLIENTS, workdir=tmp_path
            )
            return running.enter_context(server)

        yield start


@pytest.mark.parametrize("fault", ["stopped", "frozen"])
def test_every_request_is_answered_while_redis_is_away_and_after(
    serve: Callable[[dict[str, Any]], CrowdServer], server: RedisServer, namespace: str, fault: str
) -> None:
    caches = {
        "default": {
            "BACKEND": "django_stampede.StampedeCache",
            "LOCATION": server.url,
            "TIMEOUT": 1,
            "OPTIONS": {
                "NAMESPACE": namespace,
                "FAIL_OPEN": True,
                "socket_timeout": 1,
                "socket_connect_timeout": 1,
            },
        }
    }
    app = serve(caches)
    statuses, renders_away, answered_away = read_through_an_outage(app, server, PATHS, CLIENTS, fault)
    assert statuses == [200] * len(statuses), app.output()
    # Without Redis, the requests of the process still share each render
    # (one per page at a time), rather than render one each.
    assert renders_away * 4 <= answered_away, (renders_away, answered_away)


def test_a_delete_made_while_redis_is_away_is_sent_when_it_answers(
    server: RedisServer, namespace: str
) -> None:
    cache = _fail_open_cache(server, namespace)
    cache.set("page", "old", 600)
    server.pause()
    try:
        assert cache.get("other") is None
        cache.set("page", "new", 600)  # dropped: "old" is owed an invalidation
        assert cache.add("added", 1) is True
        with pytest.raises(ValueError, match="not found"):  # as on an empty cache
            cache.incr("counter")
    finally:
        server.resume()

    def replaced() -> bool:
        # Read with the cache's own instance (it signs its values), which
        # sends what it owes before its first read that reaches Redis.
        try:
            entry = cache.stampede.get(cache.make_key("page"))
        except stampede.RedisUnavailableError:
            return False
        return entry is not None and entry.value == "old" and not entry.is_fresh()

    wait_until(replaced, timeout=15)  # served stale while one request renders it again


def test_while_redis_is_away_a_header_list_seen_before_leads_to_the_page(
    server: RedisServer, namespace: str
) -> None:
    # cache_page reads the page's header list, then the page. Were the list
    # a miss while Redis is away, the request would render for it beside the
    # one rendering the page (which read the list just before): two renders
    # in one process. The list the process saw last is read instead.
    import django_stampede

    cache = _fail_open_cache(server, namespace)
    seen = "views.decorators.cache.cache_header.p.seen"
    cache.set(seen, ["HTTP_ACCEPT"], 600)
    assert cache.get(seen) == ["HTTP_ACCEPT"]
    server.stop()
    try:
        with django_stampede.lease_scope():
            assert cache.get(seen) == ["HTTP_ACCEPT"]
            assert cache.get(seen) == ["HTTP_ACCEPT"]  # and to every request after it
            assert cache.get("views.decorators.cache.cache_header.p.unseen") is None
    finally:
        server.start()


def _fail_open_cache(server: RedisServer, namespace: str) -> Any:
    """A ``StampedeCache`` with ``FAIL_OPEN`` whose connections give up after half a second."""
    import django_stampede

    options = {
        "NAMESPACE": namespace,
        "FAIL_OPEN": True,
        "socket_timeout": 0.5,
        "socket_connect_timeout": 0.5,
    }
    return django_stampede.StampedeCache(server.url, {"OPTIONS": options})
