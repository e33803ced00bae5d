"""The Flask-Caching backend with ``fail_open`` while its Redis is stopped:
no call raises, writes are dropped, and the removals are sent once Redis is
back."""

from __future__ import annotations

import pytest
from flask import Flask
from flask_caching import Cache

import stampede
from stampede.testing import RedisServer
from tests.helpers import wait_until

pytestmark = pytest.mark.slow


def test_flask_caching_goes_on_without_redis_and_owes_its_removals(
    server: RedisServer, namespace: str
) -> None:
    app = Flask(__name__)
    app.config.update(
        SECRET_KEY="flask-outage-test-not-secret",
        CACHE_TYPE="flask_stampede.StampedeCache",
        CACHE_REDIS_URL=server.url,
        CACHE_DEFAULT_TIMEOUT=600,
        CACHE_OPTIONS={
            "namespace": namespace,
            "fail_open": True,
            "redis_options": {"socket_timeout": 0.5, "socket_connect_timeout": 0.5},
        },
    )
    cache = Cache(app)
    with app.app_context():
        cache.set("page", "old")
        backend = app.extensions["cache"][cache]
        assert backend.stampede.get("flask_cache_page").value == "old"  # the key as Redis has it
        server.stop()
        try:
            assert cache.get("page") is None
            cache.set("page", "new")  # not stored: "old" is owed an invalidation
            assert cache.get_many("page", "other") == [None, None]
            assert cache.delete("other") is False
            assert cache.add("added", 1) is True
        finally:
            server.start()
        # Until Redis is found back, the process serves what it wrote meanwhile;
        # after, what Redis has: its old value, stale (one reader renders it again).
        assert cache.get("page") in ("new", "old", None)

    def replaced() -> bool:
        # Read with the backend's own instance (it signs its values and has
        # its serializer), which sends what it owes before its first read
        # that reaches Redis: the old value, if the restarted server kept
        # it, is no longer fresh.
        try:
            entry = backend.stampede.get("flask_cache_page")
        except stampede.RedisUnavailableError:
            return False
        return not backend.stampede._owed.pending and (entry is None or not entry.is_fresh())

    wait_until(replaced)
    backend.stampede.client.close()
