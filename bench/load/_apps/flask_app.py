"""The Flask apps: one cached page, by Flask-Caching's ``@cache.cached`` (on stampede's
Flask-Caching backend or on Flask-Caching's own ``RedisCache``) or by ``flask_stampede``'s
``@stampede.cached``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from flask import Flask

from .._renders import RenderLog

__all__ = ["TTL", "Kind", "create_app"]

#: Seconds a page stays cached: far longer than a run, so each run sees one cold key and no expiry.
TTL = 60

Kind = Literal["flask-caching", "flask-caching-stock", "flask-stampede"]
View = Callable[..., Any]


def _cached(app: Flask, kind: Kind, url: str, namespace: str) -> Callable[[View], View]:
    """The decorator that caches the page, with the app configured for it."""
    if kind == "flask-stampede":
        from flask_stampede import Stampede

        app.config.update(STAMPEDE_REDIS_URL=url, STAMPEDE_NAMESPACE=namespace)
        return Stampede(app).cached(ttl=TTL)
    from flask_caching import Cache

    app.config.update(
        CACHE_TYPE="flask_stampede.StampedeCache" if kind == "flask-caching" else "RedisCache",
        CACHE_REDIS_URL=url,
        CACHE_DEFAULT_TIMEOUT=TTL,
        CACHE_KEY_PREFIX=f"{namespace}:",
    )
    cache = Cache(app)
    decorate: Callable[[View], View] = cache.cached(timeout=TTL)
    return decorate


def create_app(kind: Kind, url: str, namespace: str) -> Flask:
    """The app; its renders are counted in the :class:`RenderLog` the environment names."""
    app = Flask(__name__)
    renders = RenderLog.from_env()
    cached = _cached(app, kind, url, namespace)

    @app.get("/ready")
    def ready() -> bytes:
        return b"ok"

    @app.get("/page")
    @cached
    def page() -> bytes:
        return renders.render()

    return app
