"""The Django site's views (its ``ROOT_URLCONF``), each caching one page the documented way.

- ``/page``: a sync view under ``cache_page``, served by a WSGI server.
- ``/apage``: an async view under ``cache_page``, served by an ASGI server.
- ``/apage-awaited``: the same under ``django_stampede.cache_page``, which awaits the cache.
- ``/aget-or-set``: an async view that caches its slow part with ``await cache.aget_or_set(key,
  coroutine_function, timeout)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import django_stampede
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.views.decorators.cache import cache_page

from .._renders import RenderLog
from .django_site import TTL

RENDERS = RenderLog.from_env()

View = Callable[..., Any]
#: ``cache_page(TTL)``, typed: Django ships no type information.
cached_page: Callable[[View], View] = cache_page(TTL)
awaited_page: Callable[[View], View] = django_stampede.cache_page(TTL)


def ready(request: HttpRequest) -> HttpResponse:
    return HttpResponse(b"ok")


@cached_page
def page(request: HttpRequest) -> HttpResponse:
    return HttpResponse(RENDERS.render())


@cached_page
async def apage(request: HttpRequest) -> HttpResponse:
    return HttpResponse(await RENDERS.arender())


@awaited_page
async def apage_awaited(request: HttpRequest) -> HttpResponse:
    return HttpResponse(await RENDERS.arender())


async def build_part() -> bytes:
    """The slow part of :func:`aget_or_set`, as the coroutine function it hands the cache."""
    return await RENDERS.arender()


async def aget_or_set(request: HttpRequest) -> HttpResponse:
    return HttpResponse(await cache.aget_or_set("many-waiters:part", build_part, TTL))


urlpatterns = [
    path("ready", ready),
    path("page", page),
    path("apage", apage),
    path("apage-awaited", apage_awaited),
    path("aget-or-set", aget_or_set),
]
