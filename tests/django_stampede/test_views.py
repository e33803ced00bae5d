"""Existing Django code, unchanged, under a stampede: many concurrent requests
through a real threaded WSGI server while the cached entry expires."""

from __future__ import annotations

import itertools
import os
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from django.core.cache import cache
from django.test import override_settings

from tests.django_stampede.project import views
from tests.helpers import run_threads, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

_namespaces = itertools.count()


@pytest.fixture(autouse=True)
def stale_serving_cache() -> Iterator[None]:
    """A cache of this test's own that serves stale pages for 30 s after expiry."""
    caches = {
        "default": {
            "BACKEND": "django_stampede.StampedeCache",
            "LOCATION": os.environ["STAMPEDE_TEST_REDIS_URL"],
            # LEASE_TTL: long, so that only a release (not expiry) frees a lease here.
            "OPTIONS": {
                "STALE_TTL": 30,
                "LEASE_TTL": 60,
                "NAMESPACE": f"views{os.getpid()}-{next(_namespaces)}",
            },
        }
    }
    with override_settings(CACHES=caches):
        views.renders.reset()
        yield
        cache.clear()


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read().decode().strip()
    except urllib.error.HTTPError as error:
        return error.code, ""


def expire_all() -> None:
    """Every entry goes stale (as at its expiry), keeping its value servable."""
    for name in cache.stampede.client.scan_iter(match=f"{cache.stampede.namespace}:*"):
        if b"}" not in name:  # a value's name: <namespace>:{<key>
            key = name.decode().split(":{", 1)[1]
            cache.stampede.invalidate(key)


@pytest.mark.parametrize("path", ["/page/", "/fragment/", "/aside/", "/async-report/"])
def test_a_stale_entry_is_rebuilt_once_and_everyone_else_is_served_stale(live_server: Any, path: str) -> None:
    url = live_server.url + path
    assert fetch(url) == (200, "render 1")
    expire_all()
    views.gate.clear()  # the rebuild will not finish until the others are answered
    try:
        rebuilder = ThreadPoolExecutor(1).submit(fetch, url)
        wait_until(lambda: views.renders.value == 2)
        responses = run_threads(23, lambda: fetch(url))
    finally:
        views.gate.set()
    # Answered while the rebuild was still running: stale, at once.
    assert responses == [(200, "render 1")] * 23
    assert rebuilder.result(30) == (200, "render 2")
    assert views.renders.value == 2
    assert fetch(url)[1].strip() == "render 2"


@pytest.mark.parametrize("path", ["/page/", "/fragment/", "/aside/", "/async-report/"])
def test_a_missing_entry_is_built_once_while_the_others_wait(live_server: Any, path: str) -> None:
    url = live_server.url + path
    responses = run_threads(24, lambda: fetch(url))
    assert views.renders.value == 1
    assert {body.strip() for status, body in responses} == {"render 1"}


def test_a_view_that_fails_after_a_miss_blocks_nobody(live_server: Any) -> None:
    status, _ = fetch(live_server.url + "/broken/")
    assert status == 500
    # The request ended (close(), once the response is closed) without a set:
    # its lease is released then, not 60 s later, so the next request can
    # rebuild straight away.
    wait_until(lambda: not list(cache.stampede.client.scan_iter(match=f"{cache.stampede.namespace}:*:lease")))
    cache.set("broken", "fixed")
    assert fetch(live_server.url + "/broken/") == (200, "fixed")


async def test_aget_or_set_coalesces_tasks_and_runs_the_default_once() -> None:
    import asyncio

    calls = 0

    async def build() -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.2)
        return "built"

    results = await asyncio.gather(*[cache.aget_or_set("report-direct", build, 60) for _ in range(30)])
    assert results == ["built"] * 30
    assert calls == 1
    await cache.adelete("report-direct")


def test_get_or_set_runs_a_callable_default_once_across_threads() -> None:
    calls = Counter[str]()

    def build() -> str:
        calls["build"] += 1
        import time

        time.sleep(0.2)
        return "built"

    results = run_threads(16, lambda: cache.get_or_set("direct", build, 60))
    assert results == ["built"] * 16
    assert calls["build"] == 1


def test_redis_client_is_real() -> None:
    assert isinstance(cache.stampede.client, redis.Redis)
