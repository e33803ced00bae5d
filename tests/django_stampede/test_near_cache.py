"""OPTIONS['NEAR_CACHE']: reads served from the process, sync and async, and
still seeing every write another process made before they began."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django_stampede import StampedeCache

import stampede
from stampede.testing import RedisServer
from tests.helpers import commands_processed, past_the_coherence_bound, wait_until

URL = os.environ.get("STAMPEDE_TEST_REDIS_URL", "")


def backend(namespace: str, location: str = URL, **options: Any) -> StampedeCache:
    return StampedeCache(location, {"OPTIONS": {"NAMESPACE": namespace, **options}})


def commands(admin: redis.Redis) -> int:
    return commands_processed(admin)


def sends_nothing(admin: redis.Redis, read: Callable[[], bool]) -> bool:
    """Whether ``read()`` is true and sent Redis nothing."""
    before = commands(admin)
    return read() and commands(admin) - before == 1  # the INFO


async def await_until(condition: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """:func:`tests.helpers.wait_until` for a coroutine condition."""
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def test_reads_are_served_from_the_process_until_another_process_writes(
    server: RedisServer, namespace: str
) -> None:
    # A server of its own: the counts below are every command it serves, with
    # nothing left running by other tests on the shared one.
    reader = backend(namespace, server.url, NEAR_CACHE=100)
    writer = backend(namespace, server.url)  # no near cache: another core, on a client of its own
    with redis.Redis.from_url(server.url, socket_timeout=5) as client:
        try:
            _served_from_the_process_until_another_process_writes(reader, writer, client)
        finally:
            reader.stampede.close()
            writer.stampede.close()


def _served_from_the_process_until_another_process_writes(
    reader: StampedeCache, writer: StampedeCache, client: redis.Redis
) -> None:
    assert writer.stampede.client is not reader.stampede.client
    writer.set("k", {"a": 1}, 60)
    # A fill is dropped when an invalidation comes in while its GET is under
    # way (the subscriber's start flushes too): read until a copy is kept.
    wait_until(lambda: sends_nothing(client, lambda: reader.get("k") == {"a": 1}))
    before = commands(client)
    assert [reader.get("k") for _ in range(200)] == [{"a": 1}] * 200
    assert commands(client) - before == 1  # the INFO above
    for i in range(50):
        writer.set("k", i, 60)
        past_the_coherence_bound()
        assert reader.get("k") == i  # the write returned before this read began
    writer.delete("k")
    past_the_coherence_bound()
    assert reader.get("k") is None  # a miss: this context holds the lease
    reader.set("k", "rebuilt", 60)
    assert writer.get("k") == "rebuilt"
    wait_until(lambda: sends_nothing(client, lambda: reader.get("k") == "rebuilt"))
    writer.invalidate("k")
    past_the_coherence_bound()
    assert reader.get("k") is None  # stale: not served from the copy; this context refreshes it
    reader.set("k", "refreshed", 60)
    assert writer.get("k") == "refreshed"


async def test_async_reads_are_served_from_the_process_too(server: RedisServer, namespace: str) -> None:
    # A server of its own, as above.
    reader = backend(namespace, server.url, NEAR_CACHE={"MAX_ENTRIES": 100})
    writer = backend(namespace, server.url)
    client = redis.Redis.from_url(server.url, socket_timeout=5)
    assert reader.astampede._near is not None
    assert reader.astampede._near.settings == stampede.NearCache(max_entries=100)
    await writer.aset("k", "v0", 60)

    async def served_from_the_process() -> bool:
        before = commands(client)
        return await reader.aget("k") == "v0" and commands(client) - before == 1

    await await_until(served_from_the_process)
    before = commands(client)
    assert [await reader.aget("k") for _ in range(200)] == ["v0"] * 200
    assert commands(client) - before == 1
    for i in range(1, 50):
        await writer.aset("k", f"v{i}", 60)
        past_the_coherence_bound()
        assert await reader.aget("k") == f"v{i}"
    await writer.adelete("k")
    past_the_coherence_bound()
    assert await reader.aget("k", "gone") == "gone"
    await reader.aset("k", "rebuilt", 60)  # commits this task's lease
    assert await writer.aget("k") == "rebuilt"
    # This test's event loop ends with it: its instances' connections go now.
    await reader.astampede.aclose()
    await writer.astampede.aclose()
    reader.stampede.close()
    writer.stampede.close()
    client.close()


def test_off_by_default(server: RedisServer, namespace: str) -> None:
    # A server of its own: the count below is every command it serves, with
    # nothing left running by other tests on the shared one.
    cache = backend(namespace, server.url)
    assert cache.stampede._near is None
    cache.set("k", "v", 60)
    assert cache.get("k") == "v"
    with redis.Redis.from_url(server.url, socket_timeout=5) as client:
        before = commands(client)
        assert [cache.get("k") for _ in range(5)] == ["v"] * 5
        assert commands(client) - before == 6  # a GET each, and the INFO
    cache.stampede.close()


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        (None, None),
        (False, None),
        (0, None),
        (True, stampede.NearCache()),
        (5000, stampede.NearCache(max_entries=5000)),
        ({}, stampede.NearCache()),
        (
            {"MAX_ENTRIES": 5000, "MAX_BYTES": 1 << 20, "MAX_VALUE_BYTES": 1 << 10},
            stampede.NearCache(max_entries=5000, max_bytes=1 << 20, max_value_bytes=1 << 10),
        ),
        (stampede.NearCache(max_value_bytes=10), stampede.NearCache(max_value_bytes=10)),
    ],
)
def test_the_values_the_setting_takes(namespace: str, setting: Any, expected: Any) -> None:
    cache = backend(namespace, NEAR_CACHE=setting)
    near = cache.stampede._near
    assert (near.settings if near is not None else None) == expected


def test_equal_settings_share_one_core_and_its_near_cache(namespace: str) -> None:
    first = backend(namespace, NEAR_CACHE=10)
    assert backend(namespace, NEAR_CACHE={"MAX_ENTRIES": 10}).stampede is first.stampede
    assert backend(namespace, NEAR_CACHE=11).stampede is not first.stampede
    assert backend(namespace).stampede is not first.stampede


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("lots", r"OPTIONS\['NEAR_CACHE'\] is invalid: near_cache must be a number of entries, .*'lots'"),
        (-1, r"OPTIONS\['NEAR_CACHE'\] is invalid: near_cache max_entries must be an int >= 1, got -1"),
        (2.5, r"OPTIONS\['NEAR_CACHE'\] is invalid"),
        (
            {"MAX_ENTRIES": 10, "max_bytes": 5},
            r"OPTIONS\['NEAR_CACHE'\] has no key 'max_bytes'; its keys are MAX_ENTRIES, MAX_BYTES",
        ),
        ({"MAX_BYTES": 0}, r"OPTIONS\['NEAR_CACHE'\]\['MAX_BYTES'\] is invalid: .*max_bytes must be"),
        ({"MAX_VALUE_BYTES": "1M"}, r"OPTIONS\['NEAR_CACHE'\]\['MAX_VALUE_BYTES'\] is invalid"),
    ],
)
def test_bad_values_name_the_setting(namespace: str, setting: Any, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        backend(namespace, NEAR_CACHE=setting)


@pytest.mark.parametrize(
    "location",
    [f"{URL},{URL}", "redis+cluster://127.0.0.1:1", "rediss+cluster://127.0.0.1:1"],
    ids=["replicas", "cluster", "cluster-tls"],
)
def test_refused_with_a_cluster_or_replicas(namespace: str, location: str) -> None:
    # Checked with the settings: no cluster client is made (none answers here).
    with pytest.raises(
        ImproperlyConfigured, match=r"OPTIONS\['NEAR_CACHE'\] cannot be used yet with a Redis"
    ):
        backend(namespace, location, NEAR_CACHE=True)
    backend(namespace, f"{URL},{URL}", NEAR_CACHE=False)  # off: fine
