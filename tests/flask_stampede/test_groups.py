"""Groups through Flask: ``tags=`` on ``cached`` and ``memoize``,
``invalidate_tags``/``delete_tags``/``invalidate_all`` on the extension, and
``tags=`` on the Flask-Caching backend's ``set``."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import stampede
from stampede.testing import RedisServer
from tests.flask_stampede.app import make_app
from tests.helpers import run_threads


def tagged_app() -> tuple[Any, Any, Any, list[Any]]:
    app, ext, cache, _ = make_app()
    calls: list[Any] = []

    @app.get("/post/<int:pk>")
    @ext.cached(600, tags=lambda pk: [f"post:{pk}"])
    def post(pk: int) -> str:
        calls.append(("post", pk))
        return f"post {pk}, render {len(calls)}"

    @app.post("/post/<int:pk>")
    def edit(pk: int) -> str:
        ext.invalidate_tags(f"post:{pk}")  # what an edit does: its pages go stale
        return "saved"

    @ext.memoize(600, tags=lambda user: [f"user:{user}"])
    def profile(user: str) -> str:
        calls.append(("profile", user))
        return f"{user}, call {len(calls)}"

    app.profile = profile
    return app, ext, cache, calls


def test_editing_a_record_renders_its_pages_again_once() -> None:
    app, _, _, _ = tagged_app()
    web = app.test_client()
    assert web.get("/post/1").text == "post 1, render 1"
    assert web.get("/post/2").text == "post 2, render 2"
    assert web.get("/post/1").text == "post 1, render 1"
    assert web.post("/post/1").text == "saved"
    assert web.get("/post/1").text == "post 1, render 3"
    assert web.get("/post/1").text == "post 1, render 3"
    assert web.get("/post/2").text == "post 2, render 2"


def test_memoized_results_carry_tags_and_groups_can_be_deleted() -> None:
    app, ext, _, calls = tagged_app()
    with app.app_context():
        assert app.profile("ann") == "ann, call 1"
        assert app.profile("bob") == "bob, call 2"
        ext.invalidate_tags("user:ann")
        assert app.profile("ann") == "ann, call 3"
        assert app.profile("ann") == "ann, call 3"
        ext.delete_tags("user:bob")
        assert ext.stampede.get(app.profile.key("bob")) is None
        assert app.profile("bob") == "bob, call 4"
        ext.invalidate_all()
        assert not ext.stampede.get(app.profile.key("ann")).is_fresh()
        with pytest.raises(
            stampede.ConfigurationError, match="invalidate_tags: each tag must be a str, got list"
        ):
            ext.invalidate_tags(["user:ann"])
    assert len(calls) == 4


def test_the_flask_caching_backend_takes_tags() -> None:
    app, _, cache, _ = tagged_app()
    backend = cache.cache
    with app.app_context():
        cache.set("k", "v", tags=["t"])
        cache.set("other", "w", tags=["u"])
        backend.invalidate_tags("t")
        assert not backend.stampede.get(backend.key_prefix + "k").is_fresh()
        assert backend.stampede.get(backend.key_prefix + "other").is_fresh()
        backend.delete_tags("u")
        assert cache.get("other") is None


def test_a_batch_through_the_extension_is_built_once_for_400_callers() -> None:
    app, ext, _, _ = tagged_app()
    keys = [f"k{i}" for i in range(100)]
    asked: list[str] = []
    lock = threading.Lock()

    def build(batch: list[str]) -> dict[str, str]:
        with lock:
            asked.extend(batch)
        time.sleep(0.05)
        return {key: f"v:{key}" for key in batch}

    def caller() -> Any:
        with app.app_context():
            return ext.get_or_rebuild_many(keys, build, ttl=600, tags=["batch"])

    # 400 requests of one process: one batch between them (redis-py's pool holds 100).
    assert run_threads(400, caller) == [{key: f"v:{key}" for key in keys}] * 400
    assert sorted(asked) == sorted(keys)


def test_a_warm_batch_through_the_extension_is_one_read() -> None:
    # A server of its own: what it counts is this test's commands alone.
    with RedisServer() as own:
        app, ext, _, _ = make_app(STAMPEDE_REDIS_URL=own.url)
        keys = [f"k{i}" for i in range(100)]
        with app.app_context():
            built = ext.get_or_rebuild_many(keys, lambda batch: {key: key for key in batch}, ttl=600)
            client = ext.stampede.client
            before = int(client.info("stats")["total_commands_processed"])
            assert ext.get_or_rebuild_many(keys, lambda batch: {}, ttl=600) == built
            assert (
                int(client.info("stats")["total_commands_processed"]) - before <= 1 + 3
            )  # the INFO, 3 at most


def test_the_tag_check_interval_is_a_setting() -> None:
    app, ext, cache, _ = make_app(STAMPEDE_TAG_CHECK_INTERVAL=2.5, CACHE_OPTIONS={"tag_check_interval": 1.5})
    with app.app_context():
        assert ext.stampede._settings.tags.interval == 2.5
        assert cache.cache.stampede._settings.tags.interval == 1.5
    with pytest.raises(stampede.ConfigurationError, match="STAMPEDE_TAG_CHECK_INTERVAL is invalid"):
        make_app(STAMPEDE_TAG_CHECK_INTERVAL="often")
