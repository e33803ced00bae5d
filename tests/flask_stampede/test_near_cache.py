"""``STAMPEDE_NEAR_CACHE`` and ``CACHE_OPTIONS["near_cache"]``: reads served
from the process, still seeing every write another process made before they began."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
from cachelib.serializers import JSONSerializer
from flask import Flask
from flask_caching import Cache
from flask_stampede import Stampede

import stampede
from stampede.testing import RedisServer
from tests.flask_stampede.app import make_app
from tests.helpers import commands_processed, past_the_coherence_bound, wait_until


def commands(admin: redis.Redis) -> int:
    return commands_processed(admin)


def sends_nothing(admin: redis.Redis, read: Callable[[], bool]) -> bool:
    """Whether ``read()`` is true and sent Redis nothing."""
    before = commands(admin)
    return read() and commands(admin) - before == 1  # the INFO


def near_app(**config: Any) -> tuple[Flask, Stampede, Cache]:
    app, ext, cache, _ = make_app(**config)
    return app, ext, cache


def test_the_extension_serves_reads_from_the_process(server: RedisServer) -> None:
    # A server of its own: the counts below are every command it serves, with
    # nothing left running by other tests on the shared one.
    with redis.Redis.from_url(server.url, socket_timeout=5) as client:
        _extension_serves_reads_from_the_process(server.url, client)


def _extension_serves_reads_from_the_process(url: str, client: redis.Redis) -> None:
    app, ext, _ = near_app(STAMPEDE_NEAR_CACHE=100, STAMPEDE_REDIS_URL=url, CACHE_REDIS_URL=url)
    settings = app.extensions["stampede"].settings
    # Another process: a core of its own on the same namespace.
    writer = stampede.Stampede(client, namespace=settings.namespace, signing_key=settings.signing_keys)
    calls: list[int] = []

    @ext.memoize(ttl=60)
    def price(item: int) -> str:
        calls.append(item)
        return "built"

    @app.get("/price")
    @ext.cached(ttl=60)
    def price_page() -> str:
        return price(1)

    with app.app_context():
        writer.set(price.key(1), "v0", ttl=60)
        # A fill is dropped when an invalidation comes in while its GET is
        # under way (the subscriber's start flushes too): read until one is kept.
        wait_until(lambda: sends_nothing(client, lambda: price(1) == "v0"))
        before = commands(client)
        assert [price(1) for _ in range(200)] == ["v0"] * 200
        assert commands(client) - before == 1  # the INFO above
        for i in range(1, 50):
            writer.set(price.key(1), f"v{i}", ttl=60)
            past_the_coherence_bound()
            assert price(1) == f"v{i}"  # the write returned before this call began
        writer.delete(price.key(1))
        past_the_coherence_bound()
        assert price(1) == "built"
        assert calls == [1]
    views = app.test_client()
    assert views.get("/price").text == "built"
    wait_until(lambda: sends_nothing(client, lambda: views.get("/price").text == "built"))
    writer.close()


def test_flask_caching_serves_reads_from_the_process(server: RedisServer, namespace: str) -> None:
    # A server of its own, as above.
    with redis.Redis.from_url(server.url, socket_timeout=5) as client:
        _flask_caching_serves_reads_from_the_process(server.url, client, namespace)


def _flask_caching_serves_reads_from_the_process(url: str, client: redis.Redis, namespace: str) -> None:
    own = {"STAMPEDE_REDIS_URL": url, "CACHE_REDIS_URL": url}
    app, _, reader = near_app(
        CACHE_OPTIONS={"namespace": namespace, "near_cache": {"max_entries": 100}}, **own
    )
    other, _, _ = near_app(CACHE_OPTIONS={"namespace": namespace}, **own)  # its own client, no near cache
    writer = next(iter(other.extensions["cache"].values()))  # another process's backend
    with app.app_context():
        near = reader.cache.stampede._near
        assert near is not None
        assert near.settings == stampede.NearCache(max_entries=100)
        writer.set("k", {"a": 1})
        # A fill is dropped when an invalidation comes in while its GET is
        # under way (the subscriber's start flushes too): read until one is kept.
        wait_until(lambda: sends_nothing(client, lambda: reader.get("k") == {"a": 1}))
        before = commands(client)
        assert [reader.get("k") for _ in range(200)] == [{"a": 1}] * 200
        assert commands(client) - before == 1  # the INFO above
        for i in range(50):
            writer.set("k", i)
            past_the_coherence_bound()
            assert reader.get("k") == i  # the write returned before this read began
        writer.delete("k")
        past_the_coherence_bound()
        assert reader.get("k") is None
        writer.clear()


def test_a_cache_serializer_keeps_the_near_cache(client: redis.Redis, namespace: str) -> None:
    # CACHE_SERIALIZER makes the backend build its core again: the new one
    # has the near cache, and the first one's is no longer tracked.
    app, _, cache = near_app(
        CACHE_SERIALIZER=JSONSerializer, CACHE_OPTIONS={"namespace": namespace, "near_cache": True}
    )
    with app.app_context():
        core = cache.cache.stampede
        assert core._near is not None
        assert core._near.settings == stampede.NearCache()
        assert core._subscriber._tracked.stores == [core._near, core._settings.tags]
        cache.set("k", "v")
        wait_until(lambda: sends_nothing(client, lambda: cache.get("k") == "v"))
        cache.clear()


def test_off_by_default(server: RedisServer) -> None:
    # A server of its own: the count below is every command it serves, with
    # nothing left running by other tests on the shared one.
    app, ext, cache = near_app(STAMPEDE_REDIS_URL=server.url, CACHE_REDIS_URL=server.url)
    assert app.extensions["stampede"].core._near is None

    @ext.memoize(ttl=60)
    def price() -> str:
        return "built"

    with redis.Redis.from_url(server.url, socket_timeout=5) as client, app.app_context():
        assert cache.cache.stampede._near is None
        assert price() == "built"
        cache.set("k", "v")
        before = commands(client)
        assert [price() for _ in range(5)] == ["built"] * 5
        assert [cache.get("k") for _ in range(5)] == ["v"] * 5
        assert commands(client) - before == 11  # a GET each, and the INFO


async def test_async_functions_read_redis() -> None:
    # Flask runs each async view or function on an event loop of its own: a
    # near cache there would start empty each time, so its cores have none.
    app, _, _ = near_app(STAMPEDE_NEAR_CACHE=True)
    state = app.extensions["stampede"]
    assert state.core._near is not None
    core = state.async_core()
    assert core._near is None
    await core.aclose()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"STAMPEDE_NEAR_CACHE": "lots"}, r"STAMPEDE_NEAR_CACHE is invalid: near_cache must be a number"),
        ({"STAMPEDE_NEAR_CACHE": -1}, r"STAMPEDE_NEAR_CACHE is invalid: near_cache max_entries must be"),
        (
            {"STAMPEDE_NEAR_CACHE": {"MAX_ENTRIES": 5}},
            r"STAMPEDE_NEAR_CACHE has no key 'MAX_ENTRIES'; its keys are max_entries, max_bytes",
        ),
        (
            {"STAMPEDE_NEAR_CACHE": {"max_bytes": 0}},
            r"STAMPEDE_NEAR_CACHE\['max_bytes'\] is invalid: near_cache max_bytes must be",
        ),
        (
            {"STAMPEDE_NEAR_CACHE": True, "STAMPEDE_REDIS_URL": "redis+cluster://127.0.0.1:1"},
            r"STAMPEDE_NEAR_CACHE cannot be used with a Redis Cluster",
        ),
        ({"CACHE_OPTIONS": {"near_cache": "lots"}}, r"CACHE_OPTIONS\['near_cache'\] is invalid: near_cache"),
        ({"CACHE_OPTIONS": {"near_cache": 2.5}}, r"CACHE_OPTIONS\['near_cache'\] is invalid"),
        (
            {"CACHE_OPTIONS": {"near_cache": {"entries": 5}}},
            r"CACHE_OPTIONS\['near_cache'\] has no key 'entries'",
        ),
        (
            {"CACHE_OPTIONS": {"near_cache": {"max_value_bytes": True}}},
            r"CACHE_OPTIONS\['near_cache'\]\['max_value_bytes'\] is invalid",
        ),
        (
            {"CACHE_OPTIONS": {"near_cache": 10}, "CACHE_REDIS_CLUSTER": "127.0.0.1:1"},
            r"CACHE_OPTIONS\['near_cache'\] cannot be used with a Redis Cluster",
        ),
    ],
)
def test_bad_values_name_the_setting(config: dict[str, Any], message: str) -> None:
    with pytest.raises(stampede.ConfigurationError, match=message):
        make_app(**config)


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        (False, None),
        (0, None),
        (500, stampede.NearCache(max_entries=500)),
        ({"max_bytes": 1 << 20}, stampede.NearCache(max_bytes=1 << 20)),
        (stampede.NearCache(max_value_bytes=10), stampede.NearCache(max_value_bytes=10)),
    ],
)
def test_the_values_the_settings_take(namespace: str, setting: Any, expected: Any) -> None:
    app, _, cache = near_app(
        STAMPEDE_NEAR_CACHE=setting, CACHE_OPTIONS={"namespace": namespace, "near_cache": setting}
    )
    with app.app_context():
        for core in (app.extensions["stampede"].core, cache.cache.stampede):
            assert (core._near.settings if core._near is not None else None) == expected
