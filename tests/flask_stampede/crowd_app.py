"""The Flask side of the crowd tests (``tests/flask_stampede/test_crowd_wsgi.py``):
``app``, with one slow cached page at ``/page``, configured by the environment
(:func:`environment`) and built when a server first asks for it."""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from flask import Flask

from tests.crowd import render

#: The environment variable that carries the app's config, as JSON.
ENV = "STAMPEDE_TEST_CROWD_APP"


def environment(config: dict[str, Any]) -> dict[str, str]:
    """What a server process needs in its environment to serve ``make_app(config)`` as ``app``."""
    return {ENV: json.dumps(config)}


@functools.cache
def _app() -> Flask:
    return make_app(json.loads(os.environ[ENV]))


def __getattr__(name: str) -> Flask:
    if name == "app":
        return _app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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

        @app.get("/tagged/<int:number>")
        @stampede.cached(ttl=600, tags=["crowd-group"])
        def tagged(number: int) -> str:
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
