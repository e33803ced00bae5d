"""The Flask side of the crowd tests (``tests/flask_stampede/test_crowd_wsgi.py``):
an app ``tests.wsgi_server`` serves, with one slow cached page at ``/page``."""

from __future__ import annotations

from typing import Any

from flask import Flask

from tests.wsgi_server import render


def make_app(config: dict[str, Any]) -> Flask:
    """``config["CROWD_ENTRY"]``: ``"stampede"`` caches ``/page`` with
    ``flask_stampede``'s ``@stampede.cached``, ``"flask-caching"`` with
    Flask-Caching's ``@cache.cached`` on the backend ``CACHE_TYPE`` names.
    Only that extension is set up, so the Redis connections are its alone."""
    app = Flask(__name__)
    entry = config.pop("CROWD_ENTRY")
    app.config.update(config)

    @app.get("/ping")
    def ping() -> str:
        return "pong"

    if entry == "stampede":
        from flask_stampede import Stampede

        stampede = Stampede(app)

        @app.get("/page")
        @stampede.cached(ttl=60)
        def page() -> str:
            return render()

    elif entry == "flask-caching":
        from flask_caching import Cache

        cache = Cache(app)

        @app.get("/page")
        @cache.cached(timeout=60)
        def cached_page() -> str:
            return render()

    else:
        raise ValueError(f"CROWD_ENTRY must be 'stampede' or 'flask-caching', got {entry!r}")
    return app
