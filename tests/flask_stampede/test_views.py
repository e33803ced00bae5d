"""Flask views and functions under a stampede, through a real threaded WSGI server."""

from __future__ import annotations

import asyncio
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from flask import Flask
from flask_stampede import Stampede

import stampede
from tests.flask_stampede.app import make_app
from tests.helpers import run_threads, wait_until


def fetch(url: str) -> tuple[int, str, dict[str, str]]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read().decode(), dict(error.headers)


def body(url: str) -> str:
    return fetch(url)[1]


def expire_all(core: stampede.Stampede) -> None:
    """Every entry goes stale (as at its expiry), keeping its value servable."""
    for name in core.client.scan_iter(match=f"{core.namespace}:*"):
        if b"}" not in name:  # a value's name: <namespace>:{<key>
            core.invalidate(name.decode().split(":{", 1)[1])


@pytest.mark.parametrize("path", ["/page", "/async-page", "/flask-caching"])
def test_a_stale_page_is_rendered_once_while_everyone_else_is_served_stale(
    serve: Callable[[Flask], str], path: str
) -> None:
    app, ext, cache, expensive = make_app()
    url = serve(app) + path
    assert body(url) == "render 1"
    with app.app_context():
        expire_all(ext.stampede if path != "/flask-caching" else cache.cache.stampede)
    expensive.gate.clear()  # the re-render will not finish until the others are answered
    try:
        rerender = ThreadPoolExecutor(1).submit(body, url)
        wait_until(lambda: expensive.runs == 2)
        bodies = run_threads(23, lambda: body(url))
    finally:
        expensive.gate.set()
    assert bodies == ["render 1"] * 23  # served stale at once, while the render ran
    assert rerender.result(30) == "render 2"
    assert expensive.runs == 2
    assert body(url) == "render 2"


@pytest.mark.parametrize("path", ["/page", "/async-page", "/flask-caching"])
def test_a_missing_page_is_rendered_once_while_the_others_wait(
    serve: Callable[[Flask], str], path: str
) -> None:
    app, _, _, expensive = make_app()
    url = serve(app) + path
    assert run_threads(24, lambda: body(url)) == ["render 1"] * 24
    assert expensive.runs == 1


def test_background_refresh_serves_even_the_refresher_stale(serve: Callable[[Flask], str]) -> None:
    app, ext, _, expensive = make_app()
    url = serve(app) + "/background"
    assert body(url) == "render 1 for /background"
    with app.app_context():
        expire_all(ext.stampede)
    expensive.gate.clear()
    try:
        assert run_threads(8, lambda: body(url)) == ["render 1 for /background"] * 8
        wait_until(lambda: expensive.runs == 2)  # refreshing in a thread, with the request's context
    finally:
        expensive.gate.set()
    wait_until(lambda: body(url) == "render 2 for /background")


def test_cache_header_and_cache_control(serve: Callable[[Flask], str]) -> None:
    app, ext, _, _ = make_app(STAMPEDE_CACHE_HEADER="X-Cache", STAMPEDE_CACHE_CONTROL=True)
    url = serve(app) + "/page"
    status, _, headers = fetch(url)
    assert (status, headers["X-Cache"]) == (200, "MISS")
    assert headers["Cache-Control"] in {
        f"max-age={age}, stale-while-revalidate=30, stale-if-error=30" for age in (1, 2)
    }
    assert fetch(url)[2]["X-Cache"] == "HIT"
    with app.app_context():
        expire_all(ext.stampede)
    expensive_holder = ThreadPoolExecutor(1).submit(fetch, url)  # the refresher
    assert expensive_holder.result(30)[2]["X-Cache"] == "MISS"


def test_uncacheable_responses_go_only_to_the_request_that_made_them(serve: Callable[[Flask], str]) -> None:
    app, _, _, expensive = make_app()
    url = serve(app) + "/cookie"
    responses = run_threads(8, lambda: fetch(url))
    # Each request renders its own: nobody gets another request's cookie.
    assert sorted(body for _, body, _ in responses) == [f"render {n}" for n in range(1, 9)]
    assert expensive.runs == 8


def test_error_responses_and_cookies_are_served_but_not_stored(serve: Callable[[Flask], str]) -> None:
    app, _, _, expensive = make_app()
    base = serve(app)
    assert fetch(base + "/error")[:2] == (503, "render 1")
    assert fetch(base + "/error")[:2] == (503, "render 2")
    assert fetch(base + "/cookie")[2]["Set-Cookie"].startswith("session=secret")
    assert body(base + "/cookie") == "render 4"


def test_a_view_that_raises_while_refreshing_is_answered_with_the_stale_page(
    serve: Callable[[Flask], str], caplog: pytest.LogCaptureFixture
) -> None:
    app, ext, _, _ = make_app()
    url = serve(app) + "/flaky"
    assert body(url) == "render 1"
    with app.app_context():
        expire_all(ext.stampede)
    with caplog.at_level(logging.WARNING, logger="stampede"):
        assert fetch(url)[:2] == (200, "render 1")
    assert "serving its stale value" in caplog.text


def test_query_strings_and_streamed_bodies(serve: Callable[[Flask], str]) -> None:
    app, _, _, _ = make_app()
    base = serve(app)
    assert body(base + "/search?q=a&page=1") == "render 1 q=a"
    assert body(base + "/search?page=1&q=a") == "render 1 q=a"  # the same query, reordered
    assert body(base + "/search?q=b") == "render 2 q=b"
    assert body(base + "/stream") == "render 3"
    assert body(base + "/stream") == "render 3"


def test_memoize_sync_and_async_and_delete_memoized() -> None:
    app, ext, cache, expensive = make_app()
    functions = app.extensions["test"]

    def in_app(call: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            with app.app_context():
                return call()

        return run

    with app.app_context():
        assert run_threads(8, in_app(lambda: functions["slow_square"](3))) == [9] * 8
        assert expensive.runs == 1
        assert ext.delete_memoized(functions["slow_square"], 3) == 1
        assert functions["slow_square"](3) == 9
        assert expensive.runs == 2
        functions["slow_square"](4)
        assert ext.delete_memoized(functions["slow_square"]) == 2  # every call

        async def many() -> list[int]:
            return await asyncio.gather(*[functions["async_square"](5) for _ in range(10)])

        assert asyncio.run(many()) == [25] * 10
        assert expensive.runs == 4
        # Flask-Caching's memoize: the function's first call ever gives it a
        # random version (each concurrent first caller its own); after that,
        # calls of one argument share one key, and one call computes it.
        assert functions["fc_square"](1) == 1
        assert run_threads(8, in_app(lambda: functions["fc_square"](6))) == [36] * 8
        assert expensive.runs == 6


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"STAMPEDE_STALE_TTLL": 5}, "STAMPEDE_STALE_TTLL is not a known setting"),
        ({"STAMPEDE_STALE_TTL": -1}, "STAMPEDE_STALE_TTL is invalid: stale_ttl must be 0 or more"),
        ({"STAMPEDE_TTL": "60"}, "STAMPEDE_TTL is invalid"),
        ({"STAMPEDE_REDIS_URL": "localhost:6379"}, "STAMPEDE_REDIS_URL must be a redis://"),
        ({"STAMPEDE_NAMESPACE": "a{b"}, "namespace must not contain"),
        (
            {"STAMPEDE_SERIALIZER": "nope.Nope"},
            "STAMPEDE_SERIALIZER is invalid: serializer .nope.Nope. cannot be imported",
        ),
        ({"STAMPEDE_CACHE_HEADER": 5}, "STAMPEDE_CACHE_HEADER must be a header name"),
        ({"STAMPEDE_CACHE_CONTROL": "yes"}, "STAMPEDE_CACHE_CONTROL must be True or False"),
        ({"CACHE_OPTIONS": {"stale_tll": 5}}, r"CACHE_OPTIONS\['stale_tll'\] is not a known option"),
    ],
)
def test_configuration_errors_name_the_setting(config: dict[str, Any], message: str) -> None:
    with pytest.raises(stampede.ConfigurationError, match=message):
        make_app(**config)


def test_an_app_without_init_app_says_so() -> None:
    app = Flask(__name__)
    ext = Stampede()

    @ext.memoize(ttl=5)
    def f() -> int:
        return 1

    with app.app_context(), pytest.raises(RuntimeError, match="init_app"):
        f()


def test_one_extension_serves_two_apps() -> None:
    ext = Stampede()
    first, second = Flask("first"), Flask("second")
    for app, namespace in ((first, "one"), (second, "two")):
        app.config.update(
            STAMPEDE_REDIS_URL=os.environ["STAMPEDE_TEST_REDIS_URL"], STAMPEDE_NAMESPACE=namespace
        )
        ext.init_app(app)
    with first.app_context():
        assert ext.stampede.namespace == "one"
    with second.app_context():
        assert ext.stampede.namespace == "two"
    assert not hasattr(ext, "app")
