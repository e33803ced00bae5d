"""One HTTP GET per caller thread, for :func:`bench.load._crowd.in_threads`: the connection is made
before the release, the request sent after it. A response other than ``200`` with the page's body,
or none within the timeout, is an error."""

from __future__ import annotations

import http.client
from collections.abc import Callable

from ._crowd import CallError, no_answer
from ._renders import BODY

__all__ = ["connector", "getter"]


def connector(port: int, timeout: float) -> Callable[[], http.client.HTTPConnection]:
    """What a caller does before the release: connect to the server on ``port``."""

    def connect() -> http.client.HTTPConnection:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        connection.connect()
        return connection

    return connect


def getter(path: str, timeout: float) -> Callable[[http.client.HTTPConnection], None]:
    """What a caller does after the release: ``GET path`` on its connection, then close it."""

    def get(connection: http.client.HTTPConnection) -> None:
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            body = response.read()
        except TimeoutError:  # the socket's timeout: the client gave up
            raise CallError(f"client timeout: {no_answer(timeout)}") from None
        finally:
            connection.close()
        if response.status != 200:
            raise CallError(f"HTTP {response.status}")
        if body != BODY:
            raise CallError(f"HTTP 200 with an unexpected body of {len(body)} bytes")

    return get
