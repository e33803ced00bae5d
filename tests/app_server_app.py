"""The smallest app for ``tests/test_app_servers.py``: ``wsgi`` and ``asgi``, each
answering ``/`` with 200 and failing ``/boom`` with a logged traceback."""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

if os.environ.get("APP_SERVER_APP_BROKEN"):
    raise RuntimeError("the app cannot start")

_log = logging.getLogger("tests.app_server_app")
Scope = MutableMapping[str, Any]


def _boom() -> None:
    try:
        raise LookupError("nothing here")
    except LookupError:
        raise RuntimeError("boom") from None


def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    if environ["PATH_INFO"] == "/boom":
        try:
            _boom()
        except RuntimeError:
            _log.exception("failed")  # the log goes to stderr, the server's log file
            start_response("500 Internal Server Error", [("Content-Type", "text/plain")])
            return [b"failed"]
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [str(os.getpid()).encode()]


async def asgi(
    scope: Scope, receive: Callable[[], Awaitable[Scope]], send: Callable[[Scope], Awaitable[None]]
) -> None:
    if scope["type"] != "http":
        return
    status, body = 200, str(os.getpid()).encode()
    if scope["path"] == "/boom":
        try:
            _boom()
        except RuntimeError:
            _log.exception("failed")
            status, body = 500, b"failed"
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": body})
