"""A Flask app whose views count how often their expensive part runs."""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from typing import Any

from flask import Flask, make_response, request
from flask_caching import Cache
from flask_stampede import Stampede

RENDER_SECONDS = 0.3
_namespaces = itertools.count()


class Expensive:
    """Counts runs; ``gate`` cleared holds a run open until a test releases it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.runs = 0
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self) -> int:
        with self._lock:
            self.runs += 1
            run = self.runs
        time.sleep(RENDER_SECONDS)
        self.gate.wait(60)
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

    app.extensions["test"] = {
        "slow_square": slow_square,
        "async_square": async_square,
        "fc_square": fc_square,
    }
    return app, stampede, cache, expensive
