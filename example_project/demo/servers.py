"""Processes the demo starts and always stops: the example apps, each served by
waitress in processes of its own (:class:`support.app_servers.AppServer`),
and the signals held back while they are stopped."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import FrameType

from support.app_servers import AppServer

__all__ = ["APPS", "STOP_SIGNALS", "app_servers", "deferred_signals"]

#: The directory holding ``example_project``: the servers import it from there.
SOURCE_ROOT = Path(__file__).resolve().parents[2]
#: Each app's WSGI callable, by import path.
APPS = {
    "django": "example_project.django_site.wsgi:application",
    "flask": "example_project.flask_app.wsgi:app",
}
#: The signals that end the demo (Ctrl-C, ``kill``, a closed terminal): it handles
#: them itself from the start, even when it inherited them ignored.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold back Ctrl-C, SIGTERM and SIGHUP while cleaning up; a second Ctrl-C
    must not interrupt the stopping of servers. Re-raised as KeyboardInterrupt after."""
    received: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        raise KeyboardInterrupt


@contextlib.contextmanager
def app_servers(
    app: str, count: int, threads: int, env: Mapping[str, str], ready_timeout: float = 60.0
) -> Iterator[list[AppServer]]:
    """Run ``count`` server processes of ``app`` (``django`` or ``flask``), ready to serve.

    Each process has ``threads`` worker threads and the environment ``env`` on
    top of this one. They are stopped on the way out, whatever happens, and
    die with this process if it dies (:class:`AppServer`'s guard); they die of
    SIGINT, SIGTERM and SIGHUP whatever this process ignores.
    """
    servers = [
        AppServer(
            APPS[app],
            "waitress",
            threads=threads,
            env=env,
            pythonpath=[SOURCE_ROOT],
            name=app,
            ready_timeout=ready_timeout,
        )
        for _ in range(count)
    ]
    try:
        for server in servers:  # all started, then all waited for: they import the app side by side
            server.start()
        deadline = time.monotonic() + ready_timeout
        for server in servers:
            server.wait_ready(deadline)
        yield servers
    finally:
        with deferred_signals():
            for server in servers:
                server.close()
