"""The request as the owner of leases: late sets, ASGI, several caches,
child tasks, and async views served by WSGI."""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.cache import caches
from django.core.handlers.asgi import ASGIHandler
from django.test import AsyncClient, Client, override_settings

from tests.django_stampede.project import views
from tests.django_stampede.test_views import fetch
from tests.helpers import lease_held, wait_until

URL = os.environ.get("STAMPEDE_TEST_REDIS_URL", "")
_namespaces = itertools.count()


def entry(**options: Any) -> dict[str, Any]:
    options.setdefault("NAMESPACE", f"requests{os.getpid()}-{next(_namespaces)}")
    return {"BACKEND": "django_stampede.StampedeCache", "LOCATION": URL, "OPTIONS": options}


@pytest.fixture
def two_caches() -> Iterator[None]:
    with override_settings(CACHES={"default": entry(LEASE_TTL=60), "other": entry(LEASE_TTL=60)}):
        yield
        caches["default"].clear()
        caches["other"].clear()


def lease_names(cache: Any) -> list[bytes]:
    return list(cache.stampede.client.scan_iter(match=f"{cache.stampede.namespace}:*:lease"))


def leases_held(cache: Any) -> list[bytes]:
    """The lease keys of ``cache`` whose lease is held now (not lapsed)."""
    client = cache.stampede.client
    return [name for name in lease_names(cache) if lease_held(client, name)]


@pytest.mark.usefixtures("settled")
def test_a_set_that_comes_after_its_lease_lapsed_still_stores() -> None:
    # A page slower than LEASE_TTL must still be cached.
    with override_settings(CACHES={"default": entry(LEASE_TTL=0.2)}):
        cache = caches["default"]
        assert cache.get("slow") is None
        wait_until(lambda: not leases_held(cache))
        cache.set("slow", "rendered")
        assert cache.get("slow") == "rendered"
        cache.clear()


def test_a_late_set_does_not_overwrite_a_newer_value() -> None:
    with override_settings(CACHES={"default": entry(LEASE_TTL=0.2)}):
        cache = caches["default"]
        assert cache.get("k") is None
        wait_until(lambda: not leases_held(cache))
        threading.Thread(target=lambda: cache.set("k", "newer")).start()
        wait_until(lambda: cache.stampede.get(cache.make_key("k")) is not None)
        cache.set("k", "older, computed before")
        assert cache.get("k") == "newer"
        cache.clear()


@pytest.mark.usefixtures("two_caches")
def test_each_cache_keeps_its_own_leases() -> None:
    default, other = caches["default"], caches["other"]
    assert default.get("k") is None  # default's lease on "k"
    other.set("k", "other's")  # must not commit default's lease on the other cache
    assert other.get("k") == "other's"
    default.set("k", "default's")
    assert default.get("k") == "default's"
    assert lease_names(default) == []
    assert lease_names(other) == []


async def test_leases_taken_by_child_tasks_belong_to_the_request(two_caches: None) -> None:
    cache = caches["default"]
    async with ThreadSensitiveContext():  # one request, as Django's ASGI handler runs each
        await asyncio.gather(cache.aget("x"), cache.aget("y"))  # two misses, two leases, in child tasks
        # The request holds them: asking again does not wait for itself...
        assert await asyncio.wait_for(cache.aget("x", "mine"), 10) == "mine"
        # ...its sync code sees them too...
        assert await sync_to_async(cache.get)("y", "mine") == "mine"
        # ...and its set commits them.
        await cache.aset("x", 1)
        assert await cache.aget("x") == 1


@pytest.mark.parametrize("before", ["a miss", "a sync request"])
def test_what_the_main_thread_did_first_is_not_shared_by_the_requests_that_follow(
    two_caches: None, before: str
) -> None:
    # A miss at start-up (a flag read in AppConfig.ready, say) or a test's
    # sync request, in the main thread: every ASGI request's context is copied
    # from there. They once shared that thread's leases, so each request's get
    # took another's lease for its own and rendered the page itself.
    cache = caches["default"]
    if before == "a miss":
        assert cache.get("start-up-flag") is None
    else:
        assert Client().get("/ping/").status_code == 200
    views.renders.reset()

    async def together() -> list[Any]:
        return await asyncio.gather(*(AsyncClient().get("/async-page/") for _ in range(6)))

    replies = asyncio.run(together())
    assert [reply.content for reply in replies] == [b"render 1"] * 6
    assert views.renders.value == 1


def test_a_lease_taken_outside_any_request_is_the_taking_tasks_alone(two_caches: None) -> None:
    cache = caches["default"]

    async def scenario() -> None:
        assert await cache.aget("k") is None  # this task's lease

        async def other() -> Any:
            return await cache.aget("k", "waited")  # not this task's: waits, as any other caller

        other_task = asyncio.ensure_future(other())
        await asyncio.sleep(0.2)
        assert not other_task.done()
        await cache.aset("k", "built")  # commits this task's lease; wakes the other
        assert await asyncio.wait_for(other_task, 10) == "built"

    asyncio.run(scenario())


def test_asgi_request_that_fails_after_a_miss_frees_its_lease(two_caches: None) -> None:
    # Django's ASGI handler runs the view in a child task and ends the request
    # from the parent: the lease must still be freed when the request ends.
    cache = caches["default"]

    async def request() -> int:
        sent: list[dict[str, Any]] = []
        scope = {
            "type": "http",
            "method": "GET",
            "path": "/broken/",
            "query_string": b"",
            "headers": [],
            "server": ("testserver", 80),
            "client": ("127.0.0.1", 1),
            "scheme": "http",
            "asgi": {"version": "3.0"},
        }
        received = False

        async def receive() -> dict[str, Any]:
            nonlocal received
            if not received:
                received = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await ASGIHandler()(scope, receive, send)
        return int(sent[0]["status"])

    assert asyncio.run(request()) == 500
    assert lease_names(cache) == []


def test_async_views_served_by_wsgi_do_not_pile_up_connections(live_server: Any, redis_url: str) -> None:
    with override_settings(CACHES={"default": entry()}):
        url = live_server.url + "/async-report/"
        fetch(url)
        with redis.Redis.from_url(redis_url) as admin:
            before = admin.info("clients")["connected_clients"]
            for _ in range(20):
                assert fetch(url)[0] == 200
            after = admin.info("clients")["connected_clients"]
        # Each request runs on a loop of its own; their connections go with them.
        assert after - before <= 2
        caches["default"].clear()


@pytest.mark.usefixtures("two_caches")
def test_incr_version_does_not_wait_for_someone_elses_lease() -> None:
    cache = caches["default"]
    holder = threading.Thread(target=lambda: cache.get("k"))  # another request misses "k", keeps the lease
    holder.start()
    holder.join(10)
    outcome: list[BaseException] = []

    def bump() -> None:
        try:
            cache.incr_version("k")
        except ValueError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=bump)
    worker.start()
    worker.join(5)  # a wait for the lease would take LEASE_TTL (60 s)
    assert not worker.is_alive()
    assert len(outcome) == 1
    assert "not found" in str(outcome[0])


def test_unhashable_pool_options_are_accepted() -> None:
    from django_stampede import StampedeCache

    cache = StampedeCache(URL, {"OPTIONS": {"retry_on_error": [ConnectionError]}})
    assert cache.stampede is StampedeCache(URL, {"OPTIONS": {"retry_on_error": [ConnectionError]}}).stampede
