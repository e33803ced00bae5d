"""The app of one many-waiters cell (:mod:`bench.load.manywaiters`), as the environment names it
(:func:`environment`): ``wsgi`` for a WSGI server and, for the Django site, ``asgi`` for an ASGI one.

The app is built when a server first asks for it, so that the benchmark can
import this module for :func:`environment` without configuring a framework.
Its renders are counted in the :class:`bench.load._renders.RenderLog` the
environment names too.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from typing import Any, cast

__all__ = ["APPS", "ENV", "environment"]

#: The environment variable that names the app, its Redis and its namespace, as JSON.
ENV = "BENCH_MANY_APP"
#: The apps, by name: the Django site on either cache, and the three Flask apps.
APPS = ("django", "django-stock", "flask-caching", "flask-caching-stock", "flask-stampede")


def environment(app: str, redis_url: str, namespace: str) -> dict[str, str]:
    """What a server process needs in its environment to serve ``app``."""
    if app not in APPS:
        raise ValueError(f"no many-waiters app named {app!r}: one of {', '.join(APPS)}")
    return {ENV: json.dumps({"app": app, "redis_url": redis_url, "namespace": namespace})}


@functools.cache
def _interfaces() -> dict[str, Callable[..., Any]]:
    try:
        config = json.loads(os.environ[ENV])
    except KeyError:
        raise RuntimeError(f"{ENV} is not set: this app is served by bench.load.manywaiters") from None
    app, url, namespace = config["app"], config["redis_url"], config["namespace"]
    if app.startswith("django"):
        from .django_site import configure

        configure("stock" if app == "django-stock" else "stampede", url, namespace)
        from django.core.asgi import get_asgi_application
        from django.core.wsgi import get_wsgi_application

        return {"wsgi": get_wsgi_application(), "asgi": get_asgi_application()}
    from .flask_app import Kind, create_app

    return {"wsgi": create_app(cast(Kind, app), url, namespace)}


def __getattr__(name: str) -> Callable[..., Any]:
    if name in ("wsgi", "asgi"):
        interfaces = _interfaces()
        if name not in interfaces:
            raise AttributeError(f"{name}: the app in {ENV} has no {name.upper()} interface")
        return interfaces[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
