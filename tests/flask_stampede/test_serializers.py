"""Flask-Caching's CACHE_SERIALIZER and stampede's own serializers, honoured."""

from __future__ import annotations

import json
import warnings

import pytest
import redis
from cachelib.serializers import JSONSerializer, RedisSerializer
from flask import Flask

import stampede
from tests.flask_stampede.app import make_app
from tests.helpers import RAN, payload_of, plant_pickle


def name_of(client: redis.Redis, app: Flask, key: str) -> bytes:
    """The Redis key the app's Flask-Caching backend stores ``key`` under."""
    namespace = app.config["CACHE_OPTIONS"]["namespace"]
    (name,) = client.keys(f"{namespace}:{{*{key}")
    return name


def stored(client: redis.Redis, app: Flask, key: str) -> bytes:
    raw = client.get(name_of(client, app, key))
    assert raw is not None
    return raw


@pytest.mark.parametrize("given", [JSONSerializer, JSONSerializer()])
def test_cache_serializer_is_used_for_the_payload(client: redis.Redis, given: object) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Flask-Caching warns when a backend has no serializer
        app, _, cache, _ = make_app(SECRET_KEY="a-secret-key-for-serializers", CACHE_SERIALIZER=given)
    assert isinstance(cache.cache.serializer, JSONSerializer)
    with app.app_context():
        cache.set("doc", {"a": [1, 2, None]})
        assert cache.get("doc") == {"a": [1, 2, None]}
        assert json.loads(payload_of(stored(client, app, "doc"), signed=True)) == {"a": [1, 2, None]}
        assert cache.cache.inc("n", 2) == 2
        assert cache.cache.inc("n", 3) == 5


def test_json_and_no_signing_still_never_unpickles(client: redis.Redis) -> None:
    app, _, cache, _ = make_app(STAMPEDE_SIGNING_KEY=False, CACHE_SERIALIZER=JSONSerializer)
    with app.app_context():
        cache.set("doc", "v")
        plant_pickle(client, name_of(client, app, "doc"))
        assert cache.get("doc") is None
    assert RAN == []


def test_values_of_another_serializer_are_misses(client: redis.Redis) -> None:
    app, _, cache, _ = make_app(SECRET_KEY="a-secret-key-for-serializers", CACHE_SERIALIZER=RedisSerializer)
    with app.app_context():
        cache.set("k", ["pickled", "by", "cachelib"])
        assert cache.get("k") == ["pickled", "by", "cachelib"]
    namespace = app.config["CACHE_OPTIONS"]["namespace"]
    other, _, other_cache, _ = make_app(
        SECRET_KEY="a-secret-key-for-serializers",
        CACHE_SERIALIZER=JSONSerializer,
        CACHE_OPTIONS={"namespace": namespace},
    )
    with other.app_context():
        assert other_cache.get("k") is None


def test_compressed_serializers_by_name(client: redis.Redis) -> None:
    page = "<p>" + "a fairly repetitive page " * 400 + "</p>"
    for name in ("json+zlib", "pickle+zstd"):
        app, ext, cache, _ = make_app(SECRET_KEY="a-secret-key-for-serializers", STAMPEDE_SERIALIZER=name)
        app.config["CACHE_OPTIONS"]["serializer"] = name
        cache.cache.stampede.client.close()  # the backend init_app replaces
        cache.init_app(app)  # again, with the serializer
        with app.app_context():
            cache.set("page", page)
            assert cache.get("page") == page
            assert len(stored(client, app, "page")) < len(page) // 10
            assert ext.stampede.get_or_rebuild("page", lambda: page, ttl=60) == page


def test_compress_above_is_a_setting() -> None:
    app, ext, cache, _ = make_app(STAMPEDE_COMPRESS_ABOVE=None, CACHE_OPTIONS={"compress_above": 64})
    with app.app_context():
        assert ext.stampede._settings.codec.compress_above is None
        assert cache.cache.stampede._settings.codec.compress_above == 64
    with pytest.raises(stampede.ConfigurationError, match="STAMPEDE_COMPRESS_ABOVE is invalid"):
        make_app(STAMPEDE_COMPRESS_ABOVE="1k")
    with pytest.raises(stampede.ConfigurationError, match=r"CACHE_OPTIONS\['compress_above'\] is invalid"):
        make_app(CACHE_OPTIONS={"compress_above": -1})
