"""What the worker processes of the Django tests run outside any request (spawned, so top level):
a loop that reads a key nobody sets, or that does cache-aside on a page, as a worker process, a
script or a task queue's worker does."""

from __future__ import annotations

import time
from multiprocessing.synchronize import Barrier
from typing import Any

import redis


def _setup(url: str, namespace: str, events: str) -> Any:
    import django
    from django.conf import settings

    counter = redis.Redis.from_url(url)

    def count(event: Any) -> None:
        counter.hincrby(events, event.kind.value, 1)

    settings.configure(
        SECRET_KEY="workers-test-not-secret",
        CACHES={
            "default": {
                "BACKEND": "django_stampede.StampedeCache",
                "LOCATION": url,
                "TIMEOUT": 1,
                "OPTIONS": {"NAMESPACE": namespace, "ON_EVENT": count},
            }
        },
    )
    django.setup()
    from django.core.cache import cache

    return cache


def read_flag(url: str, namespace: str, events: str, loops: int, barrier: Barrier, queue: Any) -> None:
    """``loops`` times: read a key nobody sets, then work 10 ms. Puts what the reads returned."""
    cache = _setup(url, namespace, events)
    barrier.wait(60)
    seen = []
    for _ in range(loops):
        seen.append(cache.get("feature:beta-banner"))
        time.sleep(0.01)
    queue.put(seen)


def cache_aside(
    url: str, namespace: str, events: str, seconds: float, render: float, barrier: Barrier, queue: Any
) -> None:
    """For ``seconds``: read the page; on a miss render it (``render`` seconds, logged in Redis as
    ``"<start> <end>"`` under ``<namespace>:renders``) and set it for 1 s. Puts what was served."""
    cache = _setup(url, namespace, events)
    log = redis.Redis.from_url(url)
    barrier.wait(60)
    served = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        body = cache.get("page")
        if body is None:
            start = time.time()
            time.sleep(render)
            body = "rendered"
            log.rpush(f"{namespace}:renders", f"{start} {time.time()}")
            cache.set("page", body, 1)
        served.append(body)
        time.sleep(0.01)
    queue.put(served)


def first_request_reads_a_flag(url: str, namespace: str, queue: Any) -> None:
    """A fresh process whose first request is the first use of the cache (so the
    backend's receivers are connected after that request started): the
    request reads a key nobody sets. Puts the lease key's value afterwards."""
    import django
    from django.conf import settings
    from django.http import HttpResponse
    from django.urls import path

    def flag(request: Any) -> HttpResponse:
        from django.core.cache import cache

        return HttpResponse(b"on" if cache.get("flag") else b"off")

    settings.configure(
        SECRET_KEY="workers-test-not-secret",
        ALLOWED_HOSTS=["testserver"],
        ROOT_URLCONF=__name__,
        CACHES={
            "default": {
                "BACKEND": "django_stampede.StampedeCache",
                "LOCATION": url,
                "OPTIONS": {"NAMESPACE": namespace},
            }
        },
    )
    django.setup()
    global urlpatterns
    urlpatterns = [path("flag", flag)]
    from django.test import Client

    assert "django_stampede" not in __import__("sys").modules  # nothing touched the cache yet
    assert Client().get("/flag").content == b"off"
    from django.core.cache import cache

    core = cache.stampede
    queue.put(core.client.get(core._keys(cache.make_key("flag")).lease))


urlpatterns: list[Any] = []
