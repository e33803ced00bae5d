"""The Django backend on a Redis Cluster and behind Sentinels, configured by settings alone;
its pool options, sync and async."""

from __future__ import annotations

import asyncio
from typing import Any

import django_stampede
import pytest
import redis
import redis._parsers
import redis.asyncio
from django.core.exceptions import ImproperlyConfigured

import stampede
from stampede.testing import RedisCluster, RedisSentinel

pytestmark = pytest.mark.slow


def backend(location: str, namespace: str, **options: Any) -> django_stampede.StampedeCache:
    return django_stampede.StampedeCache(location, {"OPTIONS": {"NAMESPACE": namespace, **options}})


def round_trips(cache: django_stampede.StampedeCache) -> None:
    keys = {f"k{i}": i for i in range(20)}  # on every master of a cluster
    cache.set_many(keys, 60)
    assert cache.get_many(list(keys)) == keys
    assert cache.get_or_set("built", lambda: "once", 60) == "once"
    assert cache.incr("k1") == 2
    cache.delete_many(list(keys))
    assert cache.get("k3") is None


async def async_round_trips(cache: django_stampede.StampedeCache) -> None:
    await cache.aset("a", 1, 60)
    assert await cache.aget("a") == 1
    assert await cache.aget_or_set("built-async", lambda: "once", 60) == "once"
    await cache.adelete("a")
    assert await cache.aget("a") is None
    # This test's event loop ends with it: its instance's wake-up connections
    # and its client's go now, rather than be found open when the loop is gone
    # (stampede closes them at the next call on another loop, which may never come).
    await cache.astampede.aclose()
    await cache.astampede.client.aclose()


async def test_on_a_cluster_sync_and_async(cluster: RedisCluster, namespace: str) -> None:
    cache = backend(cluster.url.replace("redis://", "redis+cluster://"), namespace)
    from asgiref.sync import sync_to_async

    await sync_to_async(round_trips)(cache)
    await async_round_trips(cache)
    await sync_to_async(cache.close)()


async def test_behind_sentinels_sync_and_async(sentinel: RedisSentinel, namespace: str) -> None:
    cache = backend(sentinel.url, namespace)
    from asgiref.sync import sync_to_async

    await sync_to_async(round_trips)(cache)
    await async_round_trips(cache)
    await sync_to_async(cache.close)()


async def test_behind_sentinels_in_django_redis_terms(sentinel: RedisSentinel, namespace: str) -> None:
    # django-redis's convention: the service as LOCATION's host, the Sentinels in OPTIONS.
    cache = backend(f"redis://{sentinel.service}/0", namespace, SENTINELS=sentinel.sentinel_addresses)
    from asgiref.sync import sync_to_async

    await sync_to_async(round_trips)(cache)
    await async_round_trips(cache)
    assert cache.stampede.client.connection_pool.service_name == sentinel.service
    await sync_to_async(cache.close)()


async def test_async_methods_honour_the_pool_options(redis_url: str, namespace: str) -> None:
    cache = backend(
        redis_url,
        namespace,
        pool_class="redis.BlockingConnectionPool",
        connection_class="redis.connection.Connection",
        parser_class="redis._parsers._RESP2Parser",
        max_connections=7,
    )
    await async_round_trips(cache)
    pool = cache.astampede.client.connection_pool
    assert type(pool) is redis.asyncio.BlockingConnectionPool  # the blocking pool's asyncio twin
    assert pool.max_connections == 7
    assert pool.connection_class is redis.asyncio.Connection
    assert pool.connection_kwargs["parser_class"] is redis._parsers._AsyncRESP2Parser


def test_a_blocking_class_without_an_asyncio_twin_is_refused_naming_it(
    redis_url: str, namespace: str
) -> None:
    cache = backend(redis_url, namespace, pool_class=f"{__name__}.HomeMadePool")
    cache.set("k", 1)  # the sync methods use it

    async def use() -> None:
        await cache.aget("k")

    with pytest.raises(ImproperlyConfigured, match="OPTIONS\\['pool_class'\\].*no asyncio twin"):
        asyncio.run(use())


class HomeMadePool(redis.ConnectionPool):
    """A blocking pool of the user's own: redis-py has no asyncio one like it."""


@pytest.mark.parametrize(
    ("location", "options", "message"),
    [
        ("redis://127.0.0.1:6379/0", {"CLIENT_CLASS": "django_redis.client.SentinelClient"}, "CLIENT_CLASS"),
        ("redis://mymaster/0", {"SENTINELS": ["127.0.0.1:26379"]}, "SENTINELS"),
        ("redis://mymaster:6379/0", {"SENTINELS": [("127.0.0.1", 26379)]}, "names the service"),
        (["redis://a/0", "redis://b/0"], {"SENTINELS": [("127.0.0.1", 26379)]}, "one 'redis://"),
    ],
)
def test_django_redis_terms_that_cannot_work_name_the_setting(
    location: Any, options: dict[str, Any], message: str, namespace: str
) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        backend(location, namespace, **options)


@pytest.mark.parametrize(
    ("location", "options", "message"),
    [
        (["redis+cluster://127.0.0.1:7000", "redis://127.0.0.1:7001"], {}, "stands alone"),
        ("redis+cluster://127.0.0.1:7000/2", {}, "only database 0"),
        ("redis+sentinel://127.0.0.1:26379", {}, "names the service"),
        ("redis+cluster://127.0.0.1:7000", {"POOL_CLASS": "redis.BlockingConnectionPool"}, "POOL_CLASS"),
    ],
)
def test_a_cluster_or_sentinel_location_that_cannot_work_names_the_setting(
    location: Any, options: dict[str, Any], message: str, namespace: str
) -> None:
    with pytest.raises((ImproperlyConfigured, stampede.ConfigurationError), match=message):
        backend(location, namespace, **options).get("k")
