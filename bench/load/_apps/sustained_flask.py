"""The Flask app of the sustained-load scenario, configured from the environment
(:class:`bench.load._apps.sustained_config.AppConfig`): ``app``, a WSGI app.

- ``/page``: a sync view under ``flask_stampede``'s ``@stampede.cached``.
- ``/fc-page``: a sync view under Flask-Caching's ``@cache.cached``, on
  ``flask_stampede.StampedeCache`` (on Flask-Caching's ``RedisCache`` for stock).
- ``/apage``: an async view under ``@stampede.cached`` (stock: cache-aside by
  hand with Flask-Caching's ``cache.get``/``cache.set``, whose decorators take
  no coroutine).
- ``/ping``: not cached: how many renders of any page have ended.

Each page logs its renders in a timeline of its own, named as its path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Flask
from flask_caching import Cache

from .._timeline import Timeline
from .sustained_config import AppConfig

CONFIG = AppConfig.from_env()
PAGES = ("page", "fc-page", "apage")
TIMELINES = {page: Timeline(CONFIG.timeline, page) for page in PAGES}
View = Callable[..., Any]

app = Flask(__name__)
_caching: dict[str, Any] = {
    "CACHE_REDIS_URL": CONFIG.redis_url,
    "CACHE_KEY_PREFIX": f"{CONFIG.namespace}:fc:",
}
if CONFIG.backend == "stampede":
    _caching.update(CACHE_TYPE="flask_stampede.StampedeCache", CACHE_OPTIONS={"stale_ttl": CONFIG.stale_ttl})
else:
    _caching.update(CACHE_TYPE="RedisCache")
cache = Cache(app, config=_caching)
if CONFIG.backend == "stampede":
    from flask_stampede import Stampede

    app.config.update(
        STAMPEDE_REDIS_URL=CONFIG.redis_url,
        STAMPEDE_NAMESPACE=CONFIG.namespace,
        STAMPEDE_STALE_TTL=CONFIG.stale_ttl,
    )
    cached: Callable[[View], View] = Stampede(app).cached(ttl=CONFIG.ttl)
else:
    cached = cache.cached(timeout=CONFIG.ttl)
flask_caching_cached: Callable[[View], View] = cache.cached(timeout=CONFIG.ttl)


@app.get("/ready")
def ready() -> bytes:
    return b"ok"


@app.get("/ping")
def ping() -> bytes:
    return str(sum(timeline.finished() for timeline in TIMELINES.values())).encode()


@app.get("/page")
@cached
def page() -> bytes:
    return TIMELINES["page"].render(CONFIG.render_seconds)


@app.get("/fc-page")
@flask_caching_cached
def fc_page() -> bytes:
    return TIMELINES["fc-page"].render(CONFIG.render_seconds)


if CONFIG.backend == "stampede":

    @app.get("/apage")
    @cached
    async def apage() -> bytes:
        return await TIMELINES["apage"].arender(CONFIG.render_seconds)

else:

    @app.get("/apage")
    async def apage() -> bytes:
        body: bytes | None = cache.get("apage")
        if body is None:
            body = await TIMELINES["apage"].arender(CONFIG.render_seconds)
            cache.set("apage", body, timeout=CONFIG.ttl)
        return body


def _asgi() -> Any:
    from a2wsgi import WSGIMiddleware

    return WSGIMiddleware(app, workers=64)  # type: ignore[arg-type]  # Flask's __call__ is one


#: The app behind an ASGI adapter (a2wsgi's ``WSGIMiddleware``, 64 threads), for ASGI servers.
asgi_app = _asgi()
