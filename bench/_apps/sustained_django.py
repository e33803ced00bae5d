"""The Django site of the sustained-load scenario, configured from the environment
(:class:`bench._apps.sustained_config.AppConfig`): ``application`` for ASGI servers,
``wsgi`` for WSGI ones.

Each page is cached the way Django's documentation, or stampede's, writes it:

- ``/page``: a sync view under Django's ``cache_page``.
- ``/apage``: an async view under ``django_stampede.cache_page`` (Django's own
  ``cache_page`` on the stock cache).
- ``/aaside``: an async view that does cache-aside by hand: ``await cache.aget(key)``,
  on a miss render and ``await cache.aset(key, body)``.
- ``/ping``: not cached: how many renders of any page have ended (a request
  answered while others wait for a render says 0 if it came before it ended).

Each page logs its renders in a timeline of its own, named as its path.

At start-up, as many sites do (a flag read in ``AppConfig.ready``, a warm-up),
the cache is asked once for a key nobody sets, in the main thread, before any
request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import django
from django.conf import settings

from .._timeline import Timeline
from .django_site import LOGGING
from .sustained_config import AppConfig

CONFIG = AppConfig.from_env()
PAGES = ("page", "apage", "aaside")
TIMELINES = {page: Timeline(CONFIG.timeline, page) for page in PAGES}


def _cache() -> dict[str, Any]:
    if CONFIG.backend == "stampede":
        return {
            "BACKEND": "django_stampede.StampedeCache",
            "LOCATION": CONFIG.redis_url,
            "TIMEOUT": CONFIG.ttl,
            "OPTIONS": {"STALE_TTL": CONFIG.stale_ttl, "NAMESPACE": CONFIG.namespace},
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


urlpatterns = [
    path("ready", ready),
    path("ping", ping),
    path("page", page),
    path("apage", apage),
    path("aaside", aaside),
]

cache.get("sustained:start-up-flag")  # a miss in the main thread, before any request
application = get_asgi_application()
wsgi = get_wsgi_application()
