"""The Django site of the never-written-key scenario, configured from the environment
(:class:`bench.load._apps.unwritten_config.AppConfig`): ``application`` for ASGI servers, ``wsgi`` for
WSGI ones.

- ``/flag``: a sync view that reads a key nobody ever sets (``cache.get``), then works for a
  moment (``time.sleep``).
- ``/aflag``: the same as an async view: ``await cache.aget``, ``await asyncio.sleep``.
- ``/slow``: a sync view under Django's ``cache_page``, whose render is slow; each render is
  logged in a :class:`bench.load._timeline.Timeline` named ``slow``.
- ``/ready``: not cached, for the benchmark to poll until the server answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import django
from django.conf import settings

from .._timeline import Timeline
from .unwritten_config import FLAG, AppConfig
from .unwritten_config import settings as site_settings

CONFIG = AppConfig.from_env()
SLOW = Timeline(CONFIG.timeline, "slow")

settings.configure(**site_settings(CONFIG, ROOT_URLCONF=__name__))
django.setup()

from django.core.asgi import get_asgi_application  # noqa: E402  (after settings)
from django.core.cache import cache  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.http import HttpRequest, HttpResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.cache import cache_page  # noqa: E402

View = Callable[..., Any]
#: Django's ``cache_page(page_timeout)``, typed: Django ships no type information.
page_cached: Callable[[View], View] = cache_page(CONFIG.page_timeout)


def ready(request: HttpRequest) -> HttpResponse:
    return HttpResponse(b"ok")


def flag(request: HttpRequest) -> HttpResponse:
    maintenance = cache.get(FLAG)
    time.sleep(CONFIG.work_seconds)
    return HttpResponse(b"maintenance" if maintenance else b"ok")


async def aflag(request: HttpRequest) -> HttpResponse:
    maintenance = await cache.aget(FLAG)
    await asyncio.sleep(CONFIG.work_seconds)
    return HttpResponse(b"maintenance" if maintenance else b"ok")


@page_cached
def slow(request: HttpRequest) -> HttpResponse:
    return HttpResponse(SLOW.render(CONFIG.render_seconds))


urlpatterns = [
    path("ready", ready),
    path("flag", flag),
    path("aflag", aflag),
    path("slow", slow),
]

application = get_asgi_application()
wsgi = get_wsgi_application()
