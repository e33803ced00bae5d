"""``CacheHeaderMiddleware``: the pages of Django's cache middleware and of
``cache_page`` say ``HIT``, ``STALE`` or ``MISS``, through Django's test
clients against the suite's redis-server."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from django.test import AsyncClient, Client, RequestFactory, override_settings
from django.utils.cache import get_cache_key

from tests.django_stampede.project import toolbar

URL = os.environ.get("STAMPEDE_TEST_REDIS_URL", "")
_namespaces = itertools.count()

HEADER = "django_stampede.middleware.CacheHeaderMiddleware"
CACHE_MIDDLEWARE = [
    HEADER,
    "django.middleware.cache.UpdateCacheMiddleware",
    "django.middleware.cache.FetchFromCacheMiddleware",
]


def caches(record_calls: bool = True) -> dict[str, Any]:
    options = {"STALE_TTL": 30, "LEASE_TTL": 60, "NAMESPACE": f"header{os.getpid()}-{next(_namespaces)}"}
    if record_calls:
        options["RECORD_CALLS"] = True
    return {"default": {"BACKEND": "django_stampede.StampedeCache", "LOCATION": URL, "OPTIONS": options}}


@pytest.fixture(autouse=True)
def site() -> Iterator[None]:
    toolbar.gate.set()
    toolbar.entered.clear()
    try:
        with override_settings(
            CACHES=caches(),
            MIDDLEWARE=CACHE_MIDDLEWARE,
            CACHE_MIDDLEWARE_SECONDS=60,
            ROOT_URLCONF="tests.django_stampede.project.toolbar",
        ):
            yield
            cache.clear()
    finally:
        toolbar.gate.set()


def test_the_cache_middlewares_pages_say_miss_then_hit_then_stale_while_another_renders() -> None:
    client = Client()
    first = client.get("/page/")
    assert first["X-Cache"] == "MISS"
    assert client.get("/page/")["X-Cache"] == "HIT"
    cache.invalidate_all()
    toolbar.gate.clear()
    toolbar.entered.clear()
    with ThreadPoolExecutor(1) as pool:
        rendering = pool.submit(Client().get, "/page/")
        assert toolbar.entered.wait(30), "no request rendered the stale page again"
        stale = client.get("/page/")  # while the page is rendered again
        toolbar.gate.set()
        rendered = rendering.result(30)
    assert stale["X-Cache"] == "STALE"
    assert stale.content == first.content
    assert rendered["X-Cache"] == "MISS"
    assert client.get("/page/")["X-Cache"] == "HIT"


def test_the_stored_page_carries_no_label() -> None:
    client = Client()
    assert client.get("/page/")["X-Cache"] == "MISS"
    key = get_cache_key(RequestFactory().get("/page/"))
    assert key is not None
    stored = cache.get(key)
    assert stored is not None
    assert not stored.has_header("X-Cache")


def test_cache_page_views_say_miss_then_hit() -> None:
    with override_settings(MIDDLEWARE=[HEADER]):
        client = Client()
        assert client.get("/cached-page/")["X-Cache"] == "MISS"
        assert client.get("/cached-page/")["X-Cache"] == "HIT"


async def test_async_cache_page_views_say_miss_then_hit() -> None:
    with override_settings(MIDDLEWARE=[HEADER]):
        client = AsyncClient()
        assert (await client.get("/async-cached-page/"))["X-Cache"] == "MISS"
        assert (await client.get("/async-cached-page/"))["X-Cache"] == "HIT"


def test_responses_the_cache_did_not_look_up_are_left_alone() -> None:
    client = Client()
    assert not client.post("/page/").has_header("X-Cache")
    with override_settings(MIDDLEWARE=[HEADER]):
        assert not Client().get("/uncached/").has_header("X-Cache")


def test_the_header_is_named_by_the_setting() -> None:
    with override_settings(STAMPEDE_CACHE_HEADER="X-Page-Cache"):
        client = Client()
        response = client.get("/page/")
    assert response["X-Page-Cache"] == "MISS"
    assert not response.has_header("X-Cache")


@pytest.mark.parametrize("value", ["X Cache", "", 42, None])
def test_a_bad_header_name_is_refused_naming_the_setting(value: Any) -> None:
    with (
        override_settings(STAMPEDE_CACHE_HEADER=value),
        pytest.raises(
            ImproperlyConfigured,
            match=rf"settings\.STAMPEDE_CACHE_HEADER must be a header name such as 'X-Cache', got {value!r}",
        ),
    ):
        Client().get("/page/")


def test_without_a_cache_that_records_its_calls_the_middleware_says_what_to_set() -> None:
    with (
        override_settings(CACHES=caches(record_calls=False)),
        pytest.raises(ImproperlyConfigured, match=r"OPTIONS\['RECORD_CALLS'\] = True"),
    ):
        Client().get("/page/")
