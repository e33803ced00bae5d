"""The Django site of the outage benchmark (:mod:`bench.faults.outage`), configured from the
environment (:class:`bench.load._apps.outage_config.AppConfig`): ``wsgi`` for WSGI servers.

- ``/page``: a sync view under Django's own ``cache_page``, whose render is slow; each render is
  logged in a :class:`bench.load._timeline.Timeline` named ``page``.
- ``/ready``: not cached, for the benchmark to poll until the server answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import django
from django.conf import settings

from .._timeline import Timeline
from .django_site import LOGGING
from .outage_config import AppConfig

CONFIG = AppConfig.from_env()
PAGE = Timeline(CONFIG.timeline, "page")

settings.configure(
    DEBUG=False,
    SECRET_KEY="bench-outage-not-secret",  # StampedeCache signs its values with it
    ALLOWED_HOSTS=["127.0.0.1", "localhost"],
    ROOT_URLCONF=__name__,
    INSTALLED_APPS=[],
    MIDDLEWARE=[],
    DATABASES={},
    USE_TZ=True,
    CACHES={"default": CONFIG.caches()},
    LOGGING=LOGGING,
)
django.setup()

from django.core.wsgi import get_wsgi_application  # noqa: E402  (after settings)
from django.http import HttpRequest, HttpResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.cache import cache_page  # noqa: E402

View = Callable[..., Any]
#: Django's ``cache_page(page_timeout)``, typed: Django ships no type information.
page_cached: Callable[[View], View] = cache_page(CONFIG.page_timeout)


def ready(request: HttpRequest) -> HttpResponse:
    return HttpResponse(b"ok")


@page_cached
def page(request: HttpRequest) -> HttpResponse:
    return HttpResponse(PAGE.render(CONFIG.render_seconds))


urlpatterns = [
    path("ready", ready),
    path("page", page),
]

wsgi = get_wsgi_application()
