from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from flask import Flask
from werkzeug.serving import make_server


@pytest.fixture
def serve() -> Iterator[Callable[[Flask], str]]:
    """Serve an app with werkzeug's threaded WSGI server; returns its base URL."""
    servers = []

    def start(app: Flask) -> str:
        server = make_server("127.0.0.1", 0, app, threaded=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def close_apps() -> Iterator[None]:
    """Close the Redis clients of the apps a test made."""
    yield
    from tests.flask_stampede.app import made

    while made:
        app = made.pop()
        app.extensions["stampede"].core.client.close()
        for backend in app.extensions.get("cache", {}).values():
            backend.stampede.client.close()
