"""The example Flask app, on stampede and on Flask-Caching's stock RedisCache:
each expensive page is built once and then served from the cache."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest
import redis
from flask import Flask

from example_project.expensive import runs_key
from example_project.flask_app import create_app
from example_project.settings import ExampleConfig

PAGES = ("/report", "/dashboard")


@pytest.fixture
def make_app(redis_url: str, namespace: str) -> Iterator[Callable[[str], Flask]]:
    made: list[Flask] = []

    def make(cache: str) -> Flask:
        settings = ExampleConfig(
            redis_url=redis_url,
            cache=cache,  # type: ignore[arg-type]
            ttl=60,
            stale_ttl=60,
            rebuild_seconds=0.0,
            wait_timeout=10.0,
            key_prefix=f"{namespace}-{cache}",
        )
        app = create_app(settings)
        made.append(app)
        return app

    yield make
    for app in made:  # close the apps' Redis clients
        app.extensions["example-products"].close()
        if "stampede" in app.extensions:
            app.extensions["stampede"].core.client.close()
        for backend in app.extensions.get("cache", {}).values():
            if hasattr(backend, "stampede"):
                backend.stampede.client.close()


def _finished_at(body: bytes) -> str:
    match = re.search(rb'data-finished-at="([0-9.]+)"', body)
    assert match is not None, body
    return match.group(1).decode()


@pytest.mark.parametrize("cache", ["stampede", "stock"])
@pytest.mark.parametrize("page", PAGES)
def test_a_page_is_built_once_then_served_from_the_cache(
    make_app: Callable[[str], Flask], client: redis.Redis, namespace: str, cache: str, page: str
) -> None:
    app = make_app(cache)
    with app.test_client() as browser:
        first = browser.get(page)
        second = browser.get(page)
    assert first.status_code == second.status_code == 200
    assert _finished_at(first.data) == _finished_at(second.data)
    runs = client.lrange(runs_key(f"{namespace}-{cache}"), 0, -1)
    assert [entry.decode().split()[0] for entry in runs] == [f"flask:{page.strip('/')}"]


def test_stampede_labels_its_cached_page(make_app: Callable[[str], Flask]) -> None:
    app = make_app("stampede")
    with app.test_client() as browser:
        labels = [browser.get("/report").headers.get("X-Cache") for _ in range(2)]
    assert labels == ["MISS", "HIT"]


def test_the_home_page_names_the_cache(make_app: Callable[[str], Flask]) -> None:
    with make_app("stock").test_client() as browser:
        body = browser.get("/").get_data(as_text=True)
    assert "<strong>stock</strong>" in body


def test_bad_settings_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMPLE_CACHE", "memcached")
    with pytest.raises(ValueError, match="EXAMPLE_CACHE"):
        create_app()
    monkeypatch.setenv("EXAMPLE_CACHE", "stock")
    monkeypatch.setenv("EXAMPLE_TTL", "soon")
    with pytest.raises(ValueError, match="EXAMPLE_TTL"):
        create_app()


def _price(body: bytes) -> str:
    match = re.search(rb'data-price="([0-9.]+)"', body)
    assert match is not None, body
    return match.group(1).decode()


@pytest.mark.parametrize("cache", ["stampede", "stock"])
def test_editing_a_product_renders_its_page_again_once(
    make_app: Callable[[str], Flask], client: redis.Redis, namespace: str, cache: str
) -> None:
    app = make_app(cache)
    with app.test_client() as browser:
        assert _price(browser.get("/products/1").data) == "249.00"
        other = browser.get("/products/2").data
        assert _price(browser.get("/products/1").data) == "249.00"
        assert browser.post("/products/1/edit", data={"price": "199.50"}).status_code == 302
        assert _price(browser.get("/products/1").data) == "199.50"
        assert _price(browser.get("/products/1").data) == "199.50"
        assert browser.get("/products/2").data == other  # not shown there: not rendered again
        assert browser.post("/products/1/edit", data={"price": "cheap"}).status_code == 400
        assert browser.get("/products/9").status_code == 404
    runs = [entry.decode().split()[0] for entry in client.lrange(runs_key(f"{namespace}-{cache}"), 0, -1)]
    assert runs == ["flask:product-1", "flask:product-2", "flask:product-1"]
