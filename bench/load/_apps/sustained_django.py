"""The Django site of the sustained-load scenario, configured from the environment
(:class:`bench.load._apps.sustained_config.AppConfig`): ``application`` for ASGI servers,
``wsgi`` for WSGI ones.

Each page is cached the way Django's documentation, or stampede's, writes it:

- ``/page``: a sync view under Django's ``cache_page``.
- ``/apage``: an async view under ``django_stampede.cache_page`` (Django's own
  ``cache_page`` on the stock cache).
- ``/aaside``: an async view that does cache-aside by hand: ``await cache.aget(key)``,
  on a miss render and ``await cache.aset(key, body)``.
- ``/ping``: not cached: how many renders of any page have ended (a request
  answered while others wait for a render says 0 if it came before it ended).
- ``/flag`` and ``/aflag``: a sync and an async view that read a key nobody
  ever sets (a flag that is normally absent: ``cache.get``, ``cache.aget``),
  then work for :data:`FLAG_WORK` seconds. Under stampede, what the cache did
  with the flag's keys is counted in Redis (``sustained_config.flag_events``).

Each page logs its renders in a timeline of its own, named as its path.

At start-up, as many sites do (a flag read in ``AppConfig.ready``, a warm-up),
the cache is asked once for a key nobody sets, in the main thread, before any
request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import django
import redis
from django.conf import settings

import stampede

from .._timeline import Timeline
from .django_site import LOGGING
from .sustained_config import AppConfig, flag_events_name

CONFIG = AppConfig.from_env()
PAGES = ("page", "apage", "aaside")
TIMELINES = {page: Timeline(CONFIG.timeline, page) for page in PAGES}
#: What the flag pages do after reading their flag: seconds of work.
FLAG_WORK = 0.05
FLAG_KEYS = ("sustained:flag", "sustained:aflag")
# Blocking: a crowd of greenlets counting at once waits for one of a few connections.
_events = redis.Redis(
    connection_pool=redis.BlockingConnectionPool.from_url(CONFIG.redis_url, max_connections=8, timeout=30)
)


def _count(event: stampede.Event) -> None:
    if event.key.endswith(FLAG_KEYS):
        _events.hincrby(flag_events_name(CONFIG.namespace), event.kind.value, 1)


def _cache() -> dict[str, Any]:
    if CONFIG.backend == "stampede":
        options = {
            "STALE_TTL": CONFIG.stale_ttl,
            "NAMESPACE": CONFIG.namespace,
            "LEASE_TTL": CONFIG.lease_ttl,
            "ON_EVENT": _count,
        }
        return {
            "BACKEND": "django_stampede.StampedeCache",
            "LOCATION": CONFIG.redis_url,
            "TIMEOUT": CONFIG.ttl,
            "OPTIONS": options,
        }
    return {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": CONFIG.redis_url,
        "TIMEOUT": CONFIG.ttl,
        "KEY_PREFIX": CONFIG.namespace,
    }


settings.configure(
    DEBUG=False,
    SECRET_KEY="bench-sustained-not-secret",
    ALLOWED_HOSTS=["127.0.0.1", "localhost"],
    ROOT_URLCONF=__name__,
    INSTALLED_APPS=[],
    MIDDLEWARE=[],
    DATABASES={},
    USE_TZ=True,
    CACHES={"default": _cache()},
    LOGGING=LOGGING,
)
django.setup()

import django_stampede  # noqa: E402  (after settings)
from django.core.asgi import get_asgi_application  # noqa: E402
from django.core.cache import cache  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.http import HttpRequest, HttpResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.cache import cache_page  # noqa: E402

View = Callable[..., Any]
#: Django's ``cache_page(TTL)``, typed: Django ships no type information.
django_page: Callable[[View], View] = cache_page(CONFIG.ttl)
awaited_page: Callable[[View], View] = (
    django_stampede.cache_page(CONFIG.ttl) if CONFIG.backend == "stampede" else django_page
)


def ready(request: HttpRequest) -> HttpResponse:
    return HttpResponse(b"ok")


def ping(request: HttpRequest) -> HttpResponse:
    return HttpResponse(str(sum(timeline.finished() for timeline in TIMELINES.values())).encode())


@django_page
def page(request: HttpRequest) -> HttpResponse:
    return HttpResponse(TIMELINES["page"].render(CONFIG.render_seconds))


@awaited_page
async def apage(request: HttpRequest) -> HttpResponse:
    return HttpResponse(await TIMELINES["apage"].arender(CONFIG.render_seconds))


async def aaside(request: HttpRequest) -> HttpResponse:
    body = await cache.aget("sustained:aside")
    if body is None:
        body = await TIMELINES["aaside"].arender(CONFIG.render_seconds)
        await cache.aset("sustained:aside", body)
    return HttpResponse(body)


def flag(request: HttpRequest) -> HttpResponse:
    shown = cache.get("sustained:flag")
    time.sleep(FLAG_WORK)
    return HttpResponse(b"on" if shown else b"off")


async def aflag(request: HttpRequest) -> HttpResponse:
    shown = await cache.aget("sustained:aflag")
    await asyncio.sleep(FLAG_WORK)
    return HttpResponse(b"on" if shown else b"off")


urlpatterns = [
    path("ready", ready),
    path("ping", ping),
    path("page", page),
    path("apage", apage),
    path("aaside", aaside),
    path("flag", flag),
    path("aflag", aflag),
]

cache.get("sustained:start-up-flag")  # a miss in the main thread, before any request
application = get_asgi_application()
wsgi = get_wsgi_application()
