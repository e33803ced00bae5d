"""Groups through Django: ``tags=`` on writes, ``invalidate_tags``,
``delete_tags``, ``invalidate_all`` (and their async twins), and
``django_stampede.cache_page(tags=...)``."""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import django_stampede
import pytest
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory, override_settings

from stampede.testing import RedisServer
from tests.helpers import run_threads

_namespaces = itertools.count()


@pytest.fixture(autouse=True)
def stale_serving_cache() -> Iterator[None]:
    caches = {
        "default": {
            "BACKEND": "django_stampede.StampedeCache",
            "LOCATION": os.environ["STAMPEDE_TEST_REDIS_URL"],
            "OPTIONS": {"STALE_TTL": 600, "NAMESPACE": f"groups{os.getpid()}-{next(_namespaces)}"},
        }
    }
    with override_settings(CACHES=caches):
        yield
        cache.clear()


def elsewhere(call: Any) -> Any:
    """``call()`` in another thread: another request, with leases of its own."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(call()))
    thread.start()
    thread.join(30)
    return result[0]


def test_invalidate_tags_serves_stale_while_one_request_refreshes() -> None:
    cache.set("post", "old post", tags=["post:1"])
    cache.set("other", "old other", tags=["post:2"])
    cache.invalidate_tags("post:1")
    # This request's get misses: it holds the lease and refreshes...
    assert cache.get("post") is None
    # ...while every other request is served the stale page at once.
    assert elsewhere(lambda: cache.get("post")) == "old post"
    cache.set("post", "new post", tags=["post:1"])
    assert elsewhere(lambda: cache.get("post")) == "new post"
    assert cache.get("other") == "old other"


def test_delete_tags_and_invalidate_all() -> None:
    cache.set_many({"a": 1, "b": 2})
    cache.set("c", 3, tags=["t"])
    cache.delete_tags("t")
    assert elsewhere(lambda: cache.get("c", "missing")) == "missing"
    assert cache.get_many(["a", "b", "c"]) == {"a": 1, "b": 2}
    cache.invalidate_all()
    assert cache.get("a") is None  # stale: this request refreshes it
    assert elsewhere(lambda: cache.get("a")) == 1


def test_get_or_set_and_add_take_tags() -> None:
    calls = []

    def build() -> str:
        calls.append(1)
        return f"built {len(calls)}"

    assert cache.get_or_set("k", build, tags=["t"]) == "built 1"
    assert cache.add("added", "x", tags=["t"])
    cache.invalidate_tags("t")
    assert cache.get_or_set("k", build, tags=["t"]) == "built 2"
    assert cache.get_or_set("k", build, tags=["t"]) == "built 2"
    assert cache.get("added") is None  # stale: this request refreshes it...
    assert elsewhere(lambda: cache.get("added")) == "x"  # ...and another is served it
    with pytest.raises(Exception, match="tags must be a list or tuple of str"):
        cache.set("k", 1, tags="t")


async def test_the_async_twins() -> None:
    await cache.aset("k", "v", tags=["t"])
    assert await cache.aget_or_set("g", lambda: "made", tags=["t"]) == "made"
    assert await cache.aadd("a", 1, tags=["u"])
    await cache.ainvalidate_tags("t")
    entry = await cache.astampede.get(cache.make_key("k"))
    assert not entry.is_fresh()
    await cache.adelete_tags("u")
    assert await cache.astampede.get(cache.make_key("a")) is None
    await cache.ainvalidate_all()
    assert not (await cache.astampede.get(cache.make_key("g"))).is_fresh()


@override_settings(ROOT_URLCONF=__name__)
def test_cache_page_tags_a_page_with_what_it_shows() -> None:
    renders: list[str] = []

    @django_stampede.cache_page(600, tags=lambda request, pk: [f"post:{pk}"])
    def post(request: HttpRequest, pk: int) -> HttpResponse:
        renders.append(f"post {pk}")
        return HttpResponse(f"post {pk}, render {len(renders)}")

    factory = RequestFactory()

    def get(pk: int) -> str:
        return elsewhere(lambda: post(factory.get(f"/post/{pk}/"), pk).content.decode())

    assert get(1) == "post 1, render 1"
    assert get(2) == "post 2, render 2"
    assert get(1) == "post 1, render 1"
    cache.invalidate_tags("post:1")
    assert get(1) == "post 1, render 3"  # rendered again once...
    assert get(1) == "post 1, render 3"
    assert get(2) == "post 2, render 2"  # ...and only the page that shows it
    with pytest.raises(ImproperlyConfigured, match=r"cache_page\(tags=...\) takes a list"):
        django_stampede.cache_page(60, tags="post:1")


async def test_cache_page_tags_an_async_view() -> None:
    renders: list[str] = []

    @django_stampede.cache_page(600, tags=["home"])
    async def home(request: HttpRequest) -> HttpResponse:
        renders.append("home")
        return HttpResponse(f"render {len(renders)}")

    factory = RequestFactory()
    assert (await home(factory.get("/"))).content == b"render 1"
    assert (await home(factory.get("/"))).content == b"render 1"
    await cache.ainvalidate_tags("home")
    assert (await home(factory.get("/"))).content == b"render 2"


def test_get_or_set_many_builds_each_key_once_for_400_requests() -> None:
    keys = [f"k{i}" for i in range(100)]
    asked: list[str] = []
    lock = threading.Lock()

    def build(batch: list[str]) -> dict[str, str]:
        with lock:
            asked.extend(batch)
        time.sleep(0.05)
        return {key: f"v:{key}" for key in batch}

    # 400 requests of one process: one batch between them (redis-py's pool holds 100).
    results = run_threads(400, lambda: cache.get_or_set_many(keys, build, 600, tags=["batch"]))
    assert results == [{key: f"v:{key}" for key in keys}] * 400
    assert sorted(asked) == sorted(keys)
    cache.invalidate_tags("batch")
    assert elsewhere(lambda: cache.get("k5")) is None  # stale: that request refreshes it


def test_a_warm_batch_through_django_is_one_read() -> None:
    # A server of its own: what it counts is this test's commands alone.
    with RedisServer() as own:
        entry = {"BACKEND": "django_stampede.StampedeCache", "LOCATION": own.url}
        with override_settings(CACHES={"default": entry}):
            keys = [f"k{i}" for i in range(100)]
            built = cache.get_or_set_many(keys, lambda batch: {key: key for key in batch}, 600)
            client = cache.stampede.client
            before = int(client.info("stats")["total_commands_processed"])
            assert cache.get_or_set_many(keys, lambda batch: {}, 600) == built
            assert (
                int(client.info("stats")["total_commands_processed"]) - before <= 1 + 3
            )  # the INFO, 3 at most


async def test_aget_or_set_many() -> None:
    async def build(batch: list[str]) -> dict[str, int]:
        return {key: len(key) for key in batch}

    assert await cache.aget_or_set_many(["a", "bb"], build) == {"a": 1, "bb": 2}
    assert await cache.aget_or_set_many(["a", "bb", "ccc"], build) == {"a": 1, "bb": 2, "ccc": 3}


async def test_get_or_set_many_without_storing_and_with_a_lease_of_the_request() -> None:
    async def build(batch: list[str]) -> dict[str, str]:
        return {key: f"built {key}" for key in batch}

    assert await cache.aget_or_set_many(["a", "b"], build, timeout=0) == {"a": "built a", "b": "built b"}
    assert await cache.aget("a") is None  # nothing stored: this request now holds its lease
    # The request's own lease: computed here, not waited for, and stored.
    assert await cache.aget_or_set_many(["a", "c"], build) == {"a": "built a", "c": "built c"}
    assert (await cache.astampede.get(cache.make_key("a"))).value == "built a"
    assert cache.get_or_set_many(["a", "d"], lambda batch: {k: k for k in batch}) == {
        "a": "built a",
        "d": "d",
    }
