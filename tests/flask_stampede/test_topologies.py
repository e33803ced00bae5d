"""The Flask extension and the Flask-Caching backend on a Redis Cluster and behind
Sentinels, configured by their URL settings alone."""

from __future__ import annotations

import itertools

import pytest
from flask import Flask
from flask_caching import Cache
from flask_stampede import Stampede

from stampede.testing import RedisCluster, RedisSentinel

pytestmark = pytest.mark.slow


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
        ext.stampede.close()


def test_on_a_cluster(cluster: RedisCluster, namespace: str) -> None:
    check(cluster.url.replace("redis://", "redis+cluster://"), namespace)


def test_behind_sentinels(sentinel: RedisSentinel, namespace: str) -> None:
    check(sentinel.url, namespace)
