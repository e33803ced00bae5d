"""The Django side of the crowd tests (``tests/django_stampede/test_crowd_wsgi.py``):
the ``ROOT_URLCONF`` of the test project as they serve it, each view caching
one slow page the documented way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import django_stampede
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.template import Context, Template
from django.urls import path
from django.views.decorators.cache import cache_page

from tests.crowd import render

View = Callable[..., Any]
#: Django's own ``cache_page``, typed (Django ships no type information).
cached_page: Callable[[View], View] = cache_page(60)


@cached_page
def page(request: HttpRequest) -> HttpResponse:
    return HttpResponse(render())


def get_or_set(request: HttpRequest) -> HttpResponse:
    return HttpResponse(cache.get_or_set("crowd-part", render, 60))


#: A template fragment under Django's own ``{% cache %}`` (``render`` is called by the template).
FRAGMENT = Template("{% load cache %}{% cache 60 crowd_fragment %}{{ render }}{% endcache %}")


def fragment(request: HttpRequest) -> HttpResponse:
    return HttpResponse(FRAGMENT.render(Context({"render": render})))


def aside(request: HttpRequest) -> HttpResponse:
    """Cache-aside, the way most code is written: a get, and a set on a miss."""
    value = cache.get("crowd-aside")
    if value is None:
        value = render()
        cache.set("crowd-aside", value, 60)
    return HttpResponse(value)


@django_stampede.cache_page(600, tags=["crowd-group"])
def tagged(request: HttpRequest, number: int) -> HttpResponse:
    return HttpResponse(render())


def ping(request: HttpRequest) -> HttpResponse:
    """Not cached: answers once the server is up."""
    return HttpResponse("pong")


urlpatterns = [
    path("page", page),
    path("get-or-set", get_or_set),
    path("fragment", fragment),
    path("aside", aside),
    path("tagged/<int:number>", tagged),
    path("ping", ping),
]
