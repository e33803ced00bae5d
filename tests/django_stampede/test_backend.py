"""What the backend adds to Django's contract, and its configuration errors."""

from __future__ import annotations

import os
from typing import Any

import pytest
from django.core.cache import CacheKeyWarning, caches
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from django_stampede import StampedeCache

import stampede

URL = os.environ.get("STAMPEDE_TEST_REDIS_URL", "")


def backend(**options: Any) -> StampedeCache:
    return StampedeCache(URL, {"OPTIONS": options})


@pytest.mark.parametrize(
    ("location", "options", "message"),
    [
        (URL, {"STALE_TTLL": 5}, r"OPTIONS\['STALE_TTLL'\] is not a known option"),
        (URL, {"STALE_TTL": -1}, r"OPTIONS\['STALE_TTL'\] is invalid: stale_ttl must be 0 or more"),
        (URL, {"LEASE_TTL": "5"}, r"OPTIONS\['LEASE_TTL'\] is invalid"),
        (URL, {"ON_WAIT_TIMEOUT": "wait"}, r"OPTIONS\['ON_WAIT_TIMEOUT'\] is invalid"),
        (URL, {"NAMESPACE": "a{b"}, r"OPTIONS\['NAMESPACE'\] is invalid"),
        (URL, {"TAG_CHECK_INTERVAL": -1}, r"OPTIONS\['TAG_CHECK_INTERVAL'\] is invalid: tag_check_interval"),
        (URL, {"COMPRESS_ABOVE": "1k"}, r"OPTIONS\['COMPRESS_ABOVE'\] is invalid: compress_above"),
        (
            URL,
            {"SERIALIZER": "yaml.nope"},
            r"OPTIONS\['SERIALIZER'\] is invalid: serializer 'yaml.nope' cannot be imported",
        ),
        (URL, {"serializer": "x"}, r"OPTIONS\['serializer'\] is not supported"),
        (URL, {"socket_timeot": 1}, r"OPTIONS\['socket_timeot'\] is not a known option"),
        (URL, "nope", r"OPTIONS must be a dict"),
        ("localhost:6379", {}, r"LOCATION entry 'localhost:6379' is not a redis://"),
        (42, {}, r"LOCATION must be a Redis URL"),
        ("", {}, r"LOCATION names no Redis server"),
    ],
    ids=lambda value: "URL" if value == URL else None,  # the same in every pytest-xdist worker
)
def test_misconfiguration_names_the_setting(location: Any, options: Any, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        StampedeCache(location, {"OPTIONS": options})


def test_settings_reach_the_core_and_the_pool() -> None:
    # As with Django's RedisCache, a database in the URL wins over OPTIONS['db'].
    cache = StampedeCache(
        URL.rsplit("/", 1)[0],
        {
            "OPTIONS": {
                "STALE_TTL": 600,
                "STALE_IF_ERROR": 3600,
                "LEASE_TTL": 3,
                "WAIT_TIMEOUT": 2.5,
                "FAIL_OPEN": True,
                "db": 3,
                "socket_timeout": 1.5,
            }
        },
    )
    options = cache.stampede.options
    assert options.stale_if_error == 3600
    assert (options.stale_ttl, options.lease_ttl, options.wait_timeout, options.fail_open) == (
        600,
        3,
        2.5,
        True,
    )
    pool = cache.stampede.client.connection_pool.connection_kwargs
    assert (pool["db"], pool["socket_timeout"]) == (3, 1.5)
    assert cache.stampede.namespace == "django"


def test_instances_with_the_same_settings_share_one_core() -> None:
    assert backend(STALE_TTL=7).stampede is backend(STALE_TTL=7).stampede
    assert backend(STALE_TTL=7).stampede is not backend(STALE_TTL=8).stampede


def test_primary_and_replicas() -> None:
    cache = StampedeCache(f"{URL},{URL}", {})
    assert len(cache.stampede.replicas) == 1  # the rest of LOCATION; reads there: tests/test_replicas.py
    cache.set("k", "v")
    assert cache.get("k") == "v"
    cache.clear()  # the default cache's namespace: later tests expect it empty


def test_json_serializer_by_name() -> None:
    cache = backend(SERIALIZER="json", NAMESPACE="json-tests")
    cache.set("k", {"a": [1]})
    assert cache.get("k") == {"a": [1]}
    assert isinstance(cache.stampede.serializer, stampede.JsonSerializer)
    cache.clear()


def test_ttl_and_invalidate() -> None:
    cache = caches["default"]
    assert cache.ttl("nothing") == 0
    cache.set("forever", 1, None)
    assert cache.ttl("forever") is None
    cache.set("k", "old", 100)
    assert 95 < cache.ttl("k") <= 100
    assert cache.invalidate("k") is True
    assert cache.ttl("k") == 0
    cache.clear()


def test_key_warnings_are_djangos() -> None:
    cache = caches["default"]
    with pytest.warns(CacheKeyWarning, match="Cache key contains characters"):
        cache.set("key with spaces", 1)
    cache.clear()


def test_get_then_set_in_one_request_commits_the_lease() -> None:
    cache = caches["default"]
    assert cache.get("k") is None  # a miss: this context now holds the lease
    assert cache.get("k", "again") == "again"  # asking again does not wait for itself
    cache.set("k", "built")
    assert cache.get("k") == "built"
    assert not list(cache.stampede.client.scan_iter(match="django:*:lease"))
    cache.clear()


async def test_async_methods_match_the_sync_ones() -> None:
    cache = caches["default"]
    assert await cache.aget("a") is None
    await cache.aset("a", 1)
    assert await cache.aget("a") == 1
    assert await cache.aadd("a", 2) is False
    assert await cache.aincr("a", 5) == 6
    assert await cache.adecr("a") == 5
    assert await cache.atouch("a", 100) is True
    assert await cache.ahas_key("a") is True
    await cache.aset_many({"b": 2, "c": 3})
    assert await cache.aget_many(iter(["a", "b", "c", "d"])) == {"a": 5, "b": 2, "c": 3}
    await cache.adelete_many(["b", "c"])
    assert await cache.adelete("a") is True
    assert await cache.aget_or_set("g", lambda: "made") == "made"
    assert await cache.attl("g") > 0
    assert await cache.ainvalidate("g") is True
    await cache.aclear()
    assert await cache.aget("g") is None
    await cache.aclose()


@override_settings(
    CACHES={"default": {"BACKEND": "django_stampede.StampedeCache", "LOCATION": URL, "TIMEOUT": None}}
)
def test_timeout_none_never_expires() -> None:
    cache = caches["default"]
    cache.set("k", "v")
    assert cache.ttl("k") is None
    assert cache.stampede.client.pttl(cache.stampede.namespace + ":{:1:k") == -1
    cache.clear()


def test_no_password_in_the_configuration_repr_or_errors(redis_url: str) -> None:
    from django_stampede._config import CacheConfig

    config = CacheConfig.from_django(
        "redis://:hunter2@127.0.0.1:6379/0", {"OPTIONS": {"password": "hunter2", "NAMESPACE": "n"}}
    )
    assert "hunter2" not in repr(config)
    assert "***" in repr(config)
    for location in ("http://:hunter2@h/0", ["redis+cluster://:hunter2@h:7000", "redis://h/0"]):
        with pytest.raises(ImproperlyConfigured) as raised:
            StampedeCache(location, {})
        assert "hunter2" not in str(raised.value)
