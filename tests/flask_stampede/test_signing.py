"""The Flask extension and the Flask-Caching backend sign values with a key
derived from the app's SECRET_KEY, when it has one."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis

import stampede
from stampede._core.envelope import SIGNED
from tests.flask_stampede.app import make_app
from tests.helpers import RAN, plant_pickle

SECRET = "a-flask-secret-key-for-these-tests"


def plant_everything(client: redis.Redis, app: Any) -> None:
    """Replace every value the app's two caches hold with a pickle that runs code."""
    namespace = app.config["STAMPEDE_NAMESPACE"]
    for name in client.scan_iter(match=f"{namespace}*"):
        if b"}" not in name:  # a value's name: <namespace>:{<key>
            plant_pickle(client, name)


def test_with_a_secret_key_no_planted_value_is_loaded(client: redis.Redis) -> None:
    app, ext, cache, expensive = make_app(SECRET_KEY=SECRET)
    web = app.test_client()
    assert web.get("/page").text == "render 1"
    assert web.get("/flask-caching").text == "render 2"
    with app.app_context():
        cache.set("k", "genuine")
        assert ext.stampede.get_or_rebuild("direct", lambda: "genuine", ttl=60) == "genuine"
    plant_everything(client, app)
    assert web.get("/page").text == "render 3"  # a miss: rendered again
    assert web.get("/flask-caching").text == "render 4"
    with app.app_context():
        assert cache.get("k") is None
        assert ext.stampede.get_or_rebuild("direct", lambda: "rebuilt", ttl=60) == "rebuilt"
    assert expensive.runs == 4


def test_signing_key_false_turns_signing_off(client: redis.Redis) -> None:
    app, _, _, _ = make_app(SECRET_KEY=SECRET, STAMPEDE_SIGNING_KEY=False)
    web = app.test_client()
    web.get("/page")
    plant_everything(client, app)
    web.get("/page")
    assert RAN == ["planted"]  # what the default prevents
    RAN.clear()


def test_without_a_secret_key_values_are_unsigned_and_it_says_so(
    client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="flask_stampede"):
        app, ext, cache, _ = make_app()
    assert "not signed" in caplog.text
    assert "SECRET_KEY" in caplog.text
    with app.app_context():
        ext.stampede.set("k", "v", ttl=60)
        cache.set("k", "v")
    assert not client.get(f"{app.config['STAMPEDE_NAMESPACE']}:{{k")[0] & SIGNED  # not signed


def test_an_explicit_key_wins_and_keys_rotate_with_the_secret(client: redis.Redis) -> None:
    old = "the-old-flask-secret-key-0123456789"
    app, ext, _, _ = make_app(SECRET_KEY=old)
    namespace = app.config["STAMPEDE_NAMESPACE"]
    with app.app_context():
        ext.stampede.set("k", "under the old secret", ttl=60)
    rotated, rotated_ext, _, _ = make_app(
        SECRET_KEY=SECRET, SECRET_KEY_FALLBACKS=[old], STAMPEDE_NAMESPACE=namespace
    )
    with rotated.app_context():
        assert rotated_ext.stampede.get("k").value == "under the old secret"
    explicit, explicit_ext, _, _ = make_app(
        SECRET_KEY=old, STAMPEDE_SIGNING_KEY="an-explicit-key-0123456789", STAMPEDE_NAMESPACE=namespace
    )
    with explicit.app_context():
        assert explicit_ext.stampede.get("k") is None


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"STAMPEDE_SIGNING_KEY": "short"},
            "^flask_stampede: STAMPEDE_SIGNING_KEY holds a 5-byte key: .*at least 16 bytes",
        ),
        ({"STAMPEDE_SIGNING_KEY": 7}, "^flask_stampede: STAMPEDE_SIGNING_KEY must be bytes or str"),
        (
            {"CACHE_OPTIONS": {"signing_key": b"x"}},
            r"^flask_stampede: CACHE_OPTIONS\['signing_key'\] holds a 1-byte key: .*at least 16 bytes",
        ),
    ],
)
def test_bad_signing_keys_name_the_setting(config: dict[str, Any], message: str) -> None:
    with pytest.raises(stampede.ConfigurationError, match=message):
        make_app(SECRET_KEY=SECRET, **config)
