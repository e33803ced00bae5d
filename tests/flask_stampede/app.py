"""A Flask app whose views count how often their expensive part runs."""

from __future__ import annotations

import asyncio
import io
import itertools
import os
import threading
import time
from typing import Any

from flask import Flask, g, make_response, request, send_file
from flask_caching import Cache
from flask_stampede import Stampede

RENDER_SECONDS = 0.3
_namespaces = itertools.count()
made: list[Flask] = []  # closed after each test (tests/flask_stampede/conftest.py)


class Expensive:
    """Counts runs; ``gate`` cleared holds a run open until a test releases it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.runs = 0
        self.running = 0
        self.peak = 0  # the most runs in progress at once
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self) -> int:
        with self._lock:
            self.runs += 1
            run = self.runs
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            time.sleep(RENDER_SECONDS)
            self.gate.wait(60)
        finally:
            with self._lock:
                self.running -= 1
        return run


def make_app(**config: Any) -> tuple[Flask, Stampede, Cache, Expensive]:
    namespace = f"flask{os.getpid()}-{next(_namespaces)}"
    app = Flask(__name__)
    app.config.update(
        STAMPEDE_REDIS_URL=os.environ["STAMPEDE_TEST_REDIS_URL"],
        STAMPEDE_NAMESPACE=namespace,
        STAMPEDE_STALE_TTL=30,
        STAMPEDE_LEASE_TTL=60,
        CACHE_TYPE="flask_stampede.StampedeCache",
        CACHE_REDIS_URL=os.environ["STAMPEDE_TEST_REDIS_URL"],
        CACHE_DEFAULT_TIMEOUT=2,
        CACHE_OPTIONS={"namespace": namespace + "-fc", "stale_ttl": 30, "lease_ttl": 60},
    )
    app.config.update(config)
    stampede = Stampede(app)
    cache = Cache(app)
    made.append(app)
    expensive = Expensive()

    @app.get("/page")
    @stampede.cached(ttl=2)
    def page() -> str:
        return f"render {expensive()}"

    @app.get("/async-page")
    @stampede.cached(ttl=2)
    async def async_page() -> str:
        await asyncio.sleep(0)
        return f"render {await asyncio.to_thread(expensive)}"

    @app.get("/background")
    @stampede.cached(ttl=2, background=True)
    def background_page() -> str:
        return f"render {expensive()} for {request.path}"

    @app.get("/flask-caching")
    @cache.cached(timeout=2)
    def flask_caching_page() -> str:
        return f"render {expensive()}"

    @app.get("/search")
    @stampede.cached(ttl=2, query_string=True)
    def search() -> str:
        return f"render {expensive()} q={request.args.get('q')}"

    @app.get("/error")
    @stampede.cached(ttl=2)
    def error() -> Any:
        return f"render {expensive()}", 503

    @app.get("/cookie")
    @stampede.cached(ttl=2)
    def cookie() -> Any:
        response = make_response(f"render {expensive()}")
        response.set_cookie("session", "secret")
        return response

    @app.get("/flaky")
    @stampede.cached(ttl=2)
    def flaky() -> str:
        if expensive() > 1:
            raise RuntimeError("the database went away")
        return "render 1"

    @app.get("/stream")
    @stampede.cached(ttl=2)
    def stream() -> Any:
        def chunks() -> Any:
            yield "render "
            yield str(expensive())

        return app.response_class(chunks())

    @app.before_request
    def who() -> None:
        g.user = request.headers.get("X-User", "anonymous")

    @app.get("/for-user")
    @stampede.cached(ttl=2, background=True)
    def for_user() -> str:
        return f"render {expensive()} by {g.user}"

    @app.route("/form", methods=["GET", "POST"])
    @stampede.cached(ttl=2)
    def form() -> str:
        return f"render {expensive()} {request.method}"

    @app.get("/conditional")
    @stampede.cached(ttl=2)
    def conditional() -> Any:
        response = make_response(f"render {expensive()}")
        response.set_etag("v1")
        return response.make_conditional(request)

    @app.get("/file")
    @stampede.cached(ttl=2)
    def file() -> Any:
        expensive()
        return send_file(io.BytesIO(b"file body"), mimetype="text/plain")

    @app.get("/login")
    @stampede.cached(ttl=2)
    def login() -> Any:
        response = make_response(f"render {expensive()}")
        if request.headers.get("X-Login"):
            response.set_cookie("session", "ann")
        return response

    @app.get("/private")
    @stampede.cached(ttl=2)
    def private() -> Any:
        response = make_response(f"render {expensive()}")
        response.cache_control.private = True
        return response

    @app.get("/own-cache-control")
    @stampede.cached(ttl=2)
    def own_cache_control() -> Any:
        response = make_response(f"render {expensive()}")
        response.cache_control.max_age = 5
        return response

    @stampede.memoize(ttl=60)
    def slow_square(x: int) -> int:
        expensive()
        return x * x

    @stampede.memoize(ttl=60)
    async def async_square(x: int) -> int:
        await asyncio.to_thread(expensive)
        return x * x

    @cache.memoize(timeout=60)
    def fc_square(x: int) -> int:
        expensive()
        return x * x

    @stampede.memoize(ttl=60, key=lambda user: f"profile:{user['id']}")
    def profile(user: dict[str, int]) -> int:
        return expensive()

    @stampede.memoize(ttl=60)
    def find(**filters: int) -> int:
        return expensive()

    @cache.memoize(timeout=60, cache_none=True)
    def maybe(x: int) -> int:
        return expensive()

    app.extensions["test"] = {
        "profile": profile,
        "find": find,
        "maybe": maybe,
        "slow_square": slow_square,
        "async_square": async_square,
        "fc_square": fc_square,
    }
    return app, stampede, cache, expensive
