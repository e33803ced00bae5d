"""Serve one app of the many-waiters scenario: ``python -m bench._apps.serve APP --server ... --port ...``.

Started (and stopped) by :mod:`bench._appserver`, with the render log named
in the environment (:data:`bench._renders.ENV`). Exits at once when its
stdin closes, so that no server outlives the benchmark, even a killed one.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["APPS", "main"]

#: The apps, by name: the Django site on either cache, and the three Flask apps.
APPS = ("django", "django-stock", "flask-caching", "flask-caching-stock", "flask-stampede")


def _exit_on_eof() -> None:
    sys.stdin.buffer.read()  # returns when the parent closes the pipe or dies
    os._exit(0)  # the server holds the main thread, perhaps blocked: no graceful exit to wait for


def _django(app: str, server: str, url: str, namespace: str) -> Callable[..., Any]:
    from .django_site import configure

    configure("stock" if app == "django-stock" else "stampede", url, namespace)
    if server == "uvicorn":
        from django.core.asgi import get_asgi_application

        asgi: Callable[..., Any] = get_asgi_application()
        return asgi
    from django.core.wsgi import get_wsgi_application

    wsgi: Callable[..., Any] = get_wsgi_application()
    return wsgi


def _flask(app: str, url: str, namespace: str) -> Callable[..., Any]:
    from .flask_app import create_app

    if app == "flask-caching":
        return create_app("flask-caching", url, namespace)
    if app == "flask-caching-stock":
        return create_app("flask-caching-stock", url, namespace)
    return create_app("flask-stampede", url, namespace)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench._apps.serve", description=__doc__)
    parser.add_argument("app", choices=APPS)
    parser.add_argument("--server", choices=("waitress", "uvicorn"), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=16, help="waitress's worker threads")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--namespace", required=True, help="prefix of every key the app writes")
    args = parser.parse_args(argv)
    if args.server == "uvicorn" and not args.app.startswith("django"):
        parser.error("only the Django site runs under uvicorn (ASGI)")
    threading.Thread(target=_exit_on_eof, name="exit-on-eof", daemon=True).start()

    if args.app.startswith("django"):
        application = _django(args.app, args.server, args.redis_url, args.namespace)
    else:
        application = _flask(args.app, args.redis_url, args.namespace)

    if args.server == "uvicorn":
        import uvicorn

        uvicorn.run(
            application,
            host="127.0.0.1",
            port=args.port,
            lifespan="off",  # Django's ASGI handler has no lifespan events
            log_level="warning",
            access_log=False,
            backlog=max(2048, 4 * args.threads),
        )
        return
    import waitress

    waitress.serve(
        application,
        host="127.0.0.1",
        port=args.port,
        threads=args.threads,
        # Every caller at once is the point: accept them all, none queued in the backlog.
        connection_limit=args.threads + 100,
        backlog=max(1024, 4 * args.threads),
        channel_timeout=60,
        # select() fails on descriptors above 1024; hundreds of clients and Redis connections get there.
        asyncore_use_poll=True,
        ident="bench-many-waiters",
    )


if __name__ == "__main__":
    main()
