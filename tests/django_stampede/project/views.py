"""Views that count how often their expensive part runs."""

from __future__ import annotations

import asyncio
import threading
import time

import django_stampede
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import cache_page


class Counter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def bump(self) -> int:
        with self._lock:
            self.value += 1
            return self.value

    def reset(self) -> None:
        with self._lock:
            self.value = 0


renders = Counter()
RENDER_SECONDS = 0.3
# Cleared by a test to hold a rebuild open until it has seen what the other
# requests got meanwhile.
gate = threading.Event()
gate.set()


def expensive() -> int:
    run = renders.bump()
    time.sleep(RENDER_SECONDS)
    gate.wait(60)
    return run


@cache_page(2)
def page(request: HttpRequest) -> HttpResponse:
    return HttpResponse(f"render {expensive()}")


def fragment(request: HttpRequest) -> HttpResponse:
    return render(request, "fragment.html", {"expensive": expensive})


def aside(request: HttpRequest) -> HttpResponse:
    value = cache.get("aside")
    if value is None:
        value = f"render {expensive()}"
        cache.set("aside", value, 2)
    return HttpResponse(value)


async def async_report(request: HttpRequest) -> HttpResponse:
    async def build() -> str:
        run = renders.bump()
        await asyncio.sleep(RENDER_SECONDS)
        await asyncio.to_thread(gate.wait, 60)
        return f"render {run}"

    return HttpResponse(await cache.aget_or_set("report", build, 2))


def broken(request: HttpRequest) -> HttpResponse:
    value = cache.get("broken")
    if value is None:
        renders.bump()
        raise RuntimeError("the view failed before setting the cache")
    return HttpResponse(value)


async def arender() -> str:
    """``expensive`` for async views: counted, slow, held by ``gate``, off the loop's thread."""
    run = renders.bump()
    await asyncio.sleep(RENDER_SECONDS)
    if not gate.is_set():
        await asyncio.to_thread(gate.wait, 60)
    return f"render {run}"


# Pages fresh for 60 s: only expire_all() makes them stale, never a slow test.
@django_stampede.cache_page(60)
async def async_page(request: HttpRequest) -> HttpResponse:
    return HttpResponse(await arender())


@cache_page(60)  # Django's own, on an async view: the cache's sync API on the event loop
async def stock_async_page(request: HttpRequest) -> HttpResponse:
    return HttpResponse(await arender())


@django_stampede.cache_page(60)
def sync_page(request: HttpRequest) -> HttpResponse:
    return HttpResponse(f"render {expensive()}")


async def ping(request: HttpRequest) -> HttpResponse:
    """Not cached: answered at once unless the server is stuck."""
    return HttpResponse("pong")


async def state(request: HttpRequest) -> HttpResponse:
    """Not cached: the number of renders so far; ``?gate=close`` or ``?gate=open``
    first, for a test that runs this project in a server process of its own."""
    if request.GET.get("gate") == "close":
        gate.clear()
    elif request.GET.get("gate") == "open":
        gate.set()
    return HttpResponse(str(renders.value))
