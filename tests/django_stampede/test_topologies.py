"""The Django backend on a Redis Cluster and behind Sentinels, configured by LOCATION alone."""

from __future__ import annotations

from typing import Any

import django_stampede
import pytest
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
