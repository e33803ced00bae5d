"""Serve an example app with waitress, a multi-threaded production WSGI server.

    python -m example_project.serve django --port 8000
    python -m example_project.serve flask --port 8001 --threads 32

Reads the same environment as the apps (``REDIS_URL``, ``EXAMPLE_CACHE``...,
see ``example_project/settings.py``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["load_app", "main"]

WSGIApp = Callable[..., Any]


def load_app(name: str) -> WSGIApp:
    """The WSGI callable of the ``django`` site or the ``flask`` app."""
    if name == "django":
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.django_site.settings")
        from example_project.django_site.wsgi import application

        wsgi: WSGIApp = application
        return wsgi
    if name == "flask":
        from example_project.flask_app import create_app

        return create_app()
    raise ValueError(f"app must be 'django' or 'flask', got {name!r}")


def _exit_on_eof() -> None:
    sys.stdin.buffer.read()  # returns when the parent closes the pipe or dies
    os._exit(0)  # waitress holds the main thread; nothing here needs a graceful exit


def _stop_signals_default() -> None:
    """Die of SIGINT, SIGTERM and SIGHUP even if started with them ignored (inherited
    from a background job or ``nohup``): whoever started this server stops it so, and
    waitress's threads need no graceful exit."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m example_project.serve", description=__doc__)
    parser.add_argument("app", choices=("django", "flask"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--threads", type=int, default=16, help="worker threads (default 16)")
    parser.add_argument(
        "--exit-on-eof",
        action="store_true",
        help="exit when stdin closes, and on SIGINT, SIGTERM and SIGHUP even if started with them "
        "ignored (the demo uses this so that no server outlives it)",
    )
    args = parser.parse_args(argv)
    import waitress

    if args.exit_on_eof:
        _stop_signals_default()
        threading.Thread(target=_exit_on_eof, name="exit-on-eof", daemon=True).start()

    waitress.serve(
        load_app(args.app),
        host=args.host,
        port=args.port,
        threads=args.threads,
        # Many clients at once are the point: do not turn them away or queue them for long.
        connection_limit=max(100, args.threads * 4),
        backlog=max(1024, args.threads * 4),
        channel_timeout=30,
        ident="stampede-example",
    )


if __name__ == "__main__":
    main()
