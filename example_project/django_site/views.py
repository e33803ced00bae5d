"""The example site's views: one page cached whole, one with a cached fragment."""

from __future__ import annotations

import functools

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import cache_page

from example_project.expensive import build_report


def home(request: HttpRequest) -> HttpResponse:
    """Not cached: links to the two expensive pages."""
    return render(request, "home.html", {"example": settings.EXAMPLE})


@cache_page(settings.EXAMPLE.ttl)
def report(request: HttpRequest) -> HttpResponse:
    """The whole response is cached by ``cache_page``."""
    return render(request, "report.html", {"report": build_report(settings.EXAMPLE, "django", "report")})


def dashboard(request: HttpRequest) -> HttpResponse:
    """Rendered on every request; its slow part sits in a ``{% cache %}`` fragment.

    The template calls ``report`` only inside the fragment, so the slow query
    runs only when the fragment is missing (or, with stampede, for the one
    request that refreshes it).
    """
    lazy_report = functools.partial(build_report, settings.EXAMPLE, "django", "dashboard")
    return render(request, "dashboard.html", {"report": lazy_report, "ttl": settings.EXAMPLE.ttl})
