"""The Flask site of the outage benchmark (:mod:`bench.faults.outage`), configured from the
environment (:class:`bench.load._apps.outage_config.AppConfig`): ``wsgi`` for WSGI servers.

- ``/page``: a view cached the way the cache's documentation caches one (Flask-Caching's
  ``@cache.cached``, or ``flask_stampede``'s ``@stampede.cached``), whose render is slow; each
  render is logged in a :class:`bench.load._timeline.Timeline` named ``page``.
- ``/ready``: not cached, for the benchmark to poll until the server answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Flask

from .._timeline import Timeline
from .outage_config import AppConfig

CONFIG = AppConfig.from_env()
PAGE = Timeline(CONFIG.timeline, "page")

View = Callable[..., Any]


def _cached(app: Flask) -> Callable[[View], View]:
    """The decorator that caches the page, with ``app`` configured for it."""
    app.config.update(CONFIG.flask_config())
    if CONFIG.cache == "flask-stampede":
        from flask_stampede import Stampede

        return Stampede(app).cached(ttl=CONFIG.page_timeout)
    from flask_caching import Cache

    decorate: Callable[[View], View] = Cache(app).cached(timeout=CONFIG.page_timeout)
    return decorate


wsgi = Flask(__name__)
cached = _cached(wsgi)


@wsgi.get("/ready")
def ready() -> bytes:
    return b"ok"


@wsgi.get("/page")
@cached
def page() -> bytes:
    return PAGE.render(CONFIG.render_seconds)
