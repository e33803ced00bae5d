"""The Flask extension and the Flask-Caching backend on a Redis Cluster and behind
Sentinels, configured by their URL settings alone."""

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from flask import Flask
from flask_caching import Cache
from flask_stampede import Stampede

import stampede
from stampede.testing import RedisCluster, RedisSentinel, RedisServer
from tests.helpers import close_core

pytestmark = pytest.mark.slow

#: The apps a test made, whose Flask-Caching backends' clients it closes (Flask-Caching never does).
_apps: list[Flask] = []


@pytest.fixture(autouse=True)
def _close_caches() -> Iterator[None]:
    yield
    while _apps:
        for backend in _apps.pop().extensions.get("cache", {}).values():
            close_core(backend.stampede)


def check(url: str, namespace: str) -> None:
    app = Flask(__name__)
    app.config.update(
        STAMPEDE_REDIS_URL=url,
        STAMPEDE_NAMESPACE=namespace,
        CACHE_TYPE="flask_stampede.StampedeCache",
        CACHE_REDIS_URL=url,
        CACHE_KEY_PREFIX=f"{namespace}-fc:",
    )
    ext = Stampede(app)
    cache = Cache(app)
    _apps.append(app)
    renders = itertools.count(1)

    @app.route("/page")
    @ext.cached(ttl=60)
    def page() -> str:
        return f"page {next(renders)}"

    @app.route("/memo/<int:n>")
    def memo(n: int) -> str:
        return str(square(n))

    @cache.memoize(timeout=60)
    def square(n: int) -> int:
        return n * n + next(renders) * 0

    client = app.test_client()
    with app.app_context():
        assert client.get("/page").text == "page 1"
        assert client.get("/page").text == "page 1"  # cached, on whichever node holds it
        assert [client.get(f"/memo/{n}").text for n in range(10)] == [str(n * n) for n in range(10)]
        cache.set_many({f"k{i}": i for i in range(10)})  # what memoize's version keys use
        assert cache.get_many(*[f"k{i}" for i in range(10)]) == list(range(10))
        close_core(ext.stampede)  # the extension's core does not own its client either


def test_on_a_cluster(cluster: RedisCluster, namespace: str) -> None:
    check(cluster.url.replace("redis://", "redis+cluster://"), namespace)


def test_behind_sentinels(sentinel: RedisSentinel, namespace: str) -> None:
    check(sentinel.url, namespace)


def flask_caching(config: dict[str, Any]) -> tuple[Flask, Cache]:
    app = Flask(__name__)
    app.config.update(CACHE_TYPE="flask_stampede.StampedeCache", **config)
    cache = Cache(app)
    _apps.append(app)
    return app, cache


def test_flask_caching_sentinel_settings(sentinel: RedisSentinel, namespace: str) -> None:
    app, cache = flask_caching(
        {
            "CACHE_REDIS_SENTINELS": sentinel.sentinel_addresses,
            "CACHE_REDIS_SENTINEL_MASTER": sentinel.service,
            "CACHE_KEY_PREFIX": f"{namespace}:",
        }
    )
    with app.app_context():
        cache.set("k", "v")
        assert cache.get("k") == "v"


def test_flask_caching_cluster_settings(cluster: RedisCluster, namespace: str) -> None:
    # The first startup node is gone: Flask-Caching's RedisClusterCache asks the others.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        gone = sock.getsockname()[1]
    nodes = ",".join(f"127.0.0.1:{port}" for port in [gone, *(node.port for node in cluster.nodes[:3])])
    app, cache = flask_caching({"CACHE_REDIS_CLUSTER": nodes, "CACHE_KEY_PREFIX": f"{namespace}:"})
    with app.app_context():
        cache.set_many({f"k{i}": i for i in range(10)})
        assert cache.get_many(*[f"k{i}" for i in range(10)]) == list(range(10))


@pytest.mark.parametrize("by", ["host and port", "url"])
def test_flask_caching_host_port_and_db_are_honoured(server: RedisServer, namespace: str, by: str) -> None:
    config: dict[str, Any] = {"CACHE_REDIS_DB": 1, "CACHE_KEY_PREFIX": f"{namespace}:"}
    if by == "url":
        # No database in the URL: CACHE_REDIS_DB names it, as Flask-Caching reads them.
        config["CACHE_REDIS_URL"] = f"redis://127.0.0.1:{server.port}"
    else:
        config.update(CACHE_REDIS_HOST="127.0.0.1", CACHE_REDIS_PORT=server.port)
    app, cache = flask_caching(config)
    with app.app_context():
        cache.set("k", "v")
        assert cache.get("k") == "v"
    with redis.Redis(port=server.port, db=1) as db1, redis.Redis(port=server.port, db=0) as db0:
        assert db1.dbsize() >= 1
        assert db0.dbsize() == 0


@pytest.mark.parametrize(
    ("config", "setting"),
    [
        ({"CACHE_REDIS_DB": "1", "CACHE_REDIS_URL": "redis://h/0"}, "CACHE_REDIS_DB"),
        ({"CACHE_REDIS_CLUSTER": "h:7000", "CACHE_REDIS_DB": 2}, "CACHE_REDIS_DB"),
        ({"CACHE_REDIS_SENTINELS": ["h"]}, "CACHE_REDIS_SENTINELS"),
        ({"CACHE_REDIS_HOST": "h", "CACHE_REDIS_PORT": "6379"}, "CACHE_REDIS_HOST"),
        ({"CACHE_REDIS_URL": "http://h"}, "CACHE_REDIS_URL"),
    ],
)
def test_flask_caching_settings_that_cannot_work_are_named(config: dict[str, Any], setting: str) -> None:
    with pytest.raises(stampede.ConfigurationError, match=setting):
        flask_caching(config)
