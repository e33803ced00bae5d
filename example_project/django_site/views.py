"""The example site's views: one page cached whole, one with a cached
fragment, and product pages tagged with the product they show."""

from __future__ import annotations

import functools
from decimal import Decimal, InvalidOperation

import django_stampede
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import cache_page
from django.views.decorators.http import require_POST

from example_project.expensive import build_report

from .catalog.models import Product


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


@django_stampede.cache_page(settings.EXAMPLE.ttl, tags=lambda request, pk: [f"product:{pk}"])
def product(request: HttpRequest, pk: int) -> HttpResponse:
    """A product's page, cached whole and tagged with the product: saving the
    product (below) marks it stale, and one request renders it again."""
    shown = get_object_or_404(Product, pk=pk)
    report = build_report(settings.EXAMPLE, "django", f"product-{pk}")
    return render(request, "product.html", {"product": shown, "report": report})


@require_POST
def edit_product(request: HttpRequest, pk: int) -> HttpResponse:
    """Change a product's price; its ``post_save`` receiver invalidates its pages."""
    edited = get_object_or_404(Product, pk=pk)
    try:
        edited.price = Decimal(request.POST.get("price", ""))
    except InvalidOperation:
        return HttpResponseBadRequest("price must be a number")
    edited.save()
    return redirect("product", pk=pk)
