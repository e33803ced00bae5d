"""Views and URLs for the debug toolbar panel's and the cache header's tests
(``ROOT_URLCONF = "tests.django_stampede.project.toolbar"``): pages whose
cache calls the panel lists, a rebuild held open by a gate, and cached pages."""

from __future__ import annotations

import threading

import django_stampede
from django.core.cache import cache, caches
from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from django.views.decorators.cache import cache_page

#: Cleared by a test to hold a rebuild open; ``entered`` is set once it is.
gate = threading.Event()
gate.set()
entered = threading.Event()


def show_toolbar(request: HttpRequest) -> bool:
    """The toolbar on every request (its default asks for DEBUG and INTERNAL_IPS)."""
    return True


def html(text: str) -> HttpResponse:
    """A page the toolbar goes into (before ``</body>``)."""
    return HttpResponse(f"<!DOCTYPE html><html><body><p>{text}</p></body></html>")


def calls(request: HttpRequest) -> HttpResponse:
    """Cache-aside, a hit, a single flight, and a read never followed by a write."""
    greeting = cache.get("greeting")
    if greeting is None:
        greeting = "hello"
        cache.set("greeting", greeting)
    cache.get("greeting")
    answer = cache.get_or_set("answer", lambda: 42)
    cache.get("never-written")
    return html(f"{greeting} {answer}")


async def async_calls(request: HttpRequest) -> HttpResponse:
    greeting = await cache.aget("greeting")
    if greeting is None:
        greeting = "hello"
        await cache.aset("greeting", greeting)
    await cache.aget("greeting")
    return html(greeting)


def escaped(request: HttpRequest) -> HttpResponse:
    """A read of a key from the query string."""
    cache.get(request.GET["key"])
    return html("read")


def rebuild(request: HttpRequest) -> HttpResponse:
    """A slow rebuild of ``report``: held at the gate until the test opens it."""
    report = cache.get("report")
    if report is None:
        entered.set()
        gate.wait(30)
        report = "built"
        cache.set("report", report)
    return html(report)


def away(request: HttpRequest) -> HttpResponse:
    """Calls of a cache whose Redis is away (``FAIL_OPEN``)."""
    away = caches["away"]
    value = away.get("profile")
    if value is None:
        value = "rendered without Redis"
        away.set("profile", value)
    return html(value)


def page(request: HttpRequest) -> HttpResponse:
    """A page the cache middleware stores, held at the gate when the test closes it."""
    entered.set()
    gate.wait(30)
    return html("a page")


@cache_page(60)
def cached_page(request: HttpRequest) -> HttpResponse:
    return html("a cached page")


@django_stampede.cache_page(60)
async def async_cached_page(request: HttpRequest) -> HttpResponse:
    return html("an async cached page")


def uncached(request: HttpRequest) -> HttpResponse:
    cache.get("greeting")
    return html("not a cached page")


urlpatterns = [
    path("calls/", calls),
    path("async-calls/", async_calls),
    path("escaped/", escaped),
    path("rebuild/", rebuild),
    path("away/", away),
    path("page/", page),
    path("cached-page/", cached_page),
    path("async-cached-page/", async_cached_page),
    path("uncached/", uncached),
    path("__debug__/", include("debug_toolbar.urls")),
]
