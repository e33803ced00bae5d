"""A small Flask app whose expensive pages are cached the usual Flask ways:
stampede's ``@stampede.cached`` on one view, and Flask-Caching's
``@cache.cached`` on another (with stampede as the Flask-Caching backend).
Product pages are tagged with their product: editing one marks its pages
stale in every process, and one request renders each again.

``EXAMPLE_CACHE=stock`` gives both views Flask-Caching's own ``RedisCache``
instead, which is what the demo compares against.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from flask import Flask, abort, redirect, render_template, request, url_for
from flask_caching import Cache
from flask_stampede import Stampede

from ..expensive import build_report
from ..settings import ExampleConfig, load
from .products import Products

__all__ = ["create_app"]

View = Callable[..., Any]


def create_app(settings: ExampleConfig | None = None) -> Flask:
    """The app, configured from the environment unless ``settings`` are given."""
    example = settings or load()
    app = Flask(__name__)
    cache = Cache()
    if example.cache == "stock":
        app.config.update(
            CACHE_TYPE="RedisCache",
            CACHE_REDIS_URL=example.redis_url,
            CACHE_DEFAULT_TIMEOUT=example.ttl,
            CACHE_KEY_PREFIX=f"{example.key_prefix}:",
        )
        cache.init_app(app)
        whole_page: Callable[[View], View] = cache.cached(timeout=example.ttl)
        product_page = whole_page

        def product_changed(pk: int) -> None:
            # Flask-Caching has no groups: delete the one page known to show it.
            cache.delete(f"view//products/{pk}")
    else:
        app.config.update(
            STAMPEDE_REDIS_URL=example.redis_url,
            STAMPEDE_NAMESPACE=f"{example.key_prefix}:flask",
            STAMPEDE_TTL=example.ttl,
            # A page past its TTL is served for this much longer while one request re-renders it.
            STAMPEDE_STALE_TTL=example.stale_ttl,
            STAMPEDE_WAIT_TIMEOUT=example.wait_timeout,
            STAMPEDE_CACHE_HEADER="X-Cache",
            # Flask-Caching code, unchanged, on stampede's backend:
            CACHE_TYPE="flask_stampede.StampedeCache",
            CACHE_REDIS_URL=example.redis_url,
            CACHE_DEFAULT_TIMEOUT=example.ttl,
            CACHE_KEY_PREFIX=f"{example.key_prefix}:",
            CACHE_OPTIONS={"stale_ttl": example.stale_ttl, "wait_timeout": example.wait_timeout},
        )
        cache.init_app(app)
        pages = Stampede(app)
        whole_page = pages.cached()
        product_page = pages.cached(tags=lambda pk: [f"product:{pk}"])

        def product_changed(pk: int) -> None:
            # Every page tagged with it goes stale, in every process.
            pages.invalidate_tags(f"product:{pk}")

    products = Products(example)
    app.extensions["example-products"] = products

    @app.get("/")
    def home() -> str:
        """Not cached: links to the two expensive pages."""
        return render_template("home.html", example=example)

    @app.get("/report")
    @whole_page
    def report() -> str:
        """The whole response is cached (``@stampede.cached``, or Flask-Caching's with ``stock``)."""
        return render_template("report.html", report=build_report(example, "flask", "report"))

    @app.get("/dashboard")
    @cache.cached(timeout=example.ttl)
    def dashboard() -> str:
        """Flask-Caching's ``@cache.cached``, as existing apps have it."""
        return render_template("report.html", report=build_report(example, "flask", "dashboard"))

    @app.get("/products/<int:pk>")
    @product_page
    def product(pk: int) -> str:
        """A product's page, tagged with the product it shows."""
        shown = products.get(pk) or abort(404)
        report = build_report(example, "flask", f"product-{pk}")
        return render_template("product.html", product=shown, report=report)

    @app.post("/products/<int:pk>/edit")
    def edit_product(pk: int) -> Any:
        """Change a product's price, and mark the pages that show it stale."""
        if products.get(pk) is None:
            abort(404)
        try:
            price = Decimal(request.form.get("price", ""))
        except InvalidOperation:
            abort(400)
        products.set_price(pk, price)
        product_changed(pk)
        return redirect(url_for("product", pk=pk))

    return app
